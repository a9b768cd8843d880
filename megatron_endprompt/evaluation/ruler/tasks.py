"""RULER's rows of the task table: the 11 synthetic tasks and qa_1/qa_2, with the resources
they share (the essay haystack, RULER's word lists, the QA files)."""

from __future__ import annotations

from megatron_endprompt.evaluation.core.config import EvalConfig
from megatron_endprompt.evaluation.core.prompt import PromptSample
from megatron_endprompt.evaluation.core.scoring import METRICS
from megatron_endprompt.evaluation.core.task import GenerationTask, Resource, TaskContext
from megatron_endprompt.evaluation.ruler import sources, synthetic
from megatron_endprompt.evaluation.ruler import qa
from megatron_endprompt.evaluation.ruler.qa import QA_TASKS, load_qa, make_qa_samples
from megatron_endprompt.evaluation.ruler.spec import RULER_TASKS

__all__ = ["ESSAY_HAYSTACK", "WORD_LISTS", "QA_FILES", "rows", "check_haystack_read"]


def _haystack(ctx: TaskContext, tasks: tuple[str, ...]) -> sources.Haystack:
    return sources.load_haystack(ctx.cfg.haystack)


def _word_lists(ctx: TaskContext, tasks: tuple[str, ...]) -> dict[str, list[str]]:
    return sources.wonder_words()  # fails early when the word lists are missing


def _qa_files(ctx: TaskContext, tasks: tuple[str, ...]) -> dict[str, object]:
    return {t: load_qa(ctx.cfg.qa_dir or "", t) for t in tasks}


def _needs_qa_dir(cfg: EvalConfig) -> str | None:
    return None if cfg.qa_dir else ("--tasks qa_1/qa_2 need --qa-dir DIR (RULER's squad.json "
                                    "and hotpotqa.json)")


#: RULER's Paul Graham essays (``--haystack``) or the shipped substitute.
ESSAY_HAYSTACK = Resource(name="essay_haystack", load=_haystack)
#: RULER's word lists (wonderwords): NIAH keys, CWE's common words.
WORD_LISTS = Resource(name="ruler_word_lists", load=_word_lists)
#: RULER's ``squad.json`` / ``hotpotqa.json`` under ``--qa-dir``.
QA_FILES = Resource(name="ruler_qa_files", load=_qa_files, requires=_needs_qa_dir)


def _synthetic(ctx: TaskContext, name: str, length: int) -> list[PromptSample]:
    return synthetic.make_ruler_samples(name, ctx.tokens, lengths=[length],
                                        samples=ctx.cfg.samples or 0, seed=ctx.cfg.seed,
                                        haystack=ctx.resources.get(ESSAY_HAYSTACK.name))


def _synthetic_fits(ctx: TaskContext, name: str, length: int) -> None:
    synthetic.check_length(name, ctx.tokens, length=length, seed=ctx.cfg.seed,
                           haystack=ctx.resources.get(ESSAY_HAYSTACK.name))


def _qa(ctx: TaskContext, name: str, length: int) -> list[PromptSample]:
    return make_qa_samples(name, ctx.tokens, qa_dir=ctx.cfg.qa_dir or "", length=length,
                           samples=ctx.cfg.samples or 0, seed=ctx.cfg.seed)


def _qa_fits(ctx: TaskContext, name: str, length: int) -> None:
    qa.check_length(name, ctx.tokens, qa_dir=ctx.cfg.qa_dir or "", length=length,
                    samples=ctx.cfg.samples or 0, seed=ctx.cfg.seed)


def rows() -> list[GenerationTask]:
    """One row per RULER task, in RULER's order (11 synthetic, then qa_1, qa_2)."""
    out = [GenerationTask(name=name, build=_synthetic, check_length=_synthetic_fits,
                          scorer=METRICS[task.metric],
                          resources=(WORD_LISTS, ESSAY_HAYSTACK) if task.haystack == "essay"
                          else (WORD_LISTS,))
           for name, task in RULER_TASKS.items()]
    return out + [GenerationTask(name=name, build=_qa, check_length=_qa_fits,
                                 scorer=METRICS["string_match_part"], resources=(QA_FILES,))
                  for name in QA_TASKS]


def check_haystack_read(cfg: EvalConfig, tasks: list[str]) -> str | None:
    """``--haystack`` given while none of ``tasks`` reads an essay haystack: the refusal."""
    if cfg.haystack is None:
        return None
    readers = [row.name for row in rows() if ESSAY_HAYSTACK in row.resources]
    if any(t in readers for t in tasks):
        return None
    return (f"--haystack {cfg.haystack}: none of --tasks uses it (only {', '.join(readers)} "
            "read an essay haystack); drop --haystack or add one of those tasks")
