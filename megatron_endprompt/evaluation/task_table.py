"""The task table: every generation task of the native backend, one row each, and the
``--tasks`` groups.

A row (``core.task.GenerationTask``) declares a task's prompt builder, scorer, length rule and
resources once; ``suite.run_eval`` dispatches through :data:`TASKS` and nothing else. Adding a
generation task is one module (its builder, scorer and length rule) and one row here.
``ppl`` is not a row: perplexity scores documents, it generates nothing (``suite`` runs it).
"""

from __future__ import annotations

from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation.core.config import EvalConfig
from megatron_endprompt.evaluation.core.task import GenerationTask, Resource
from megatron_endprompt.evaluation.passkey import tasks as passkey_tasks
from megatron_endprompt.evaluation.ruler import tasks as ruler_tasks
from megatron_endprompt.evaluation.ruler.qa import QA_TASKS
from megatron_endprompt.evaluation.ruler.spec import SYNTHETIC_TASKS

__all__ = ["TASKS", "TASK_GROUPS", "PPL", "task_names", "resolve_tasks", "rows_of",
           "resources_of", "check_flags"]

#: ``--tasks`` name -> its row (RULER's 13, passkey, the legacy five).
TASKS: dict[str, GenerationTask] = {
    row.name: row for row in (*ruler_tasks.rows(), *passkey_tasks.rows())}
#: The perplexity measurement's ``--tasks`` name.
PPL = "ppl"
#: ``--tasks`` groups -> the task names they expand to.
TASK_GROUPS: dict[str, tuple[str, ...]] = {
    "ruler": SYNTHETIC_TASKS,
    "ruler_niah": tuple(t for t in SYNTHETIC_TASKS if t.startswith("niah_")),
    "legacy": passkey_tasks.LEGACY_TASKS,
    "ruler13": (*SYNTHETIC_TASKS, *QA_TASKS),
    "none": (),
}


def task_names() -> tuple[str, ...]:
    """Every ``--tasks`` name: the groups, the rows, ``ppl``."""
    return (*TASK_GROUPS, *TASKS, PPL)


def resolve_tasks(text: str) -> list[str]:
    """Comma list of task names and groups -> task names (groups expanded, order kept)."""
    names = task_names()
    out: list[str] = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        if item not in names:
            raise UserError(f"--tasks: unknown task {item!r}; choose from {', '.join(names)}")
        out.extend(TASK_GROUPS.get(item, (item,)))
    if not out and "none" not in text.split(","):
        raise UserError("--tasks: give at least one task")
    return list(dict.fromkeys(out))


def rows_of(tasks: list[str]) -> list[GenerationTask]:
    """The rows of the table among ``tasks`` (in their order; ``ppl`` and lm-eval names are
    not rows)."""
    return [TASKS[t] for t in tasks if t in TASKS]


def resources_of(rows: list[GenerationTask]) -> dict[str, tuple[Resource, tuple[str, ...]]]:
    """Each resource the rows name (once, first use first) with the tasks that read it."""
    out: dict[str, tuple[Resource, tuple[str, ...]]] = {}
    for row in rows:
        for res in row.resources:
            have = out.get(res.name, (res, ()))[1]
            out[res.name] = (res, (*have, row.name))
    return out


def check_flags(cfg: EvalConfig) -> None:
    """What the run's tasks need of the flags: each resource's requirement (``--qa-dir`` for
    qa_1/qa_2) and no data flag that none of them reads (``--haystack``); ``UserError``."""
    for res, _ in resources_of(rows_of(cfg.tasks)).values():
        refusal = res.requires(cfg)
        if refusal:
            raise UserError(refusal)
    for check in _FLAG_CHECKS:
        refusal = check(cfg, cfg.tasks)
        if refusal:
            raise UserError(refusal)


#: Refusals of data flags the run's tasks do not read.
_FLAG_CHECKS = (ruler_tasks.check_haystack_read,)
