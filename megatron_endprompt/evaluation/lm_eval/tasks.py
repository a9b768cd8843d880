"""``--backend lm-eval``'s tasks: any lm-evaluation-harness task (registered or local), built and
its documents chosen before the model loads (the run: ``lm_eval_run``).

Why through lm-eval's own objects: ``TaskManager(include_path=...)`` finds local task YAMLs
(``--lm-eval-include``), building the tasks first lets every input (names, data, lengths) be
refused in one line before the model loads or any output exists, and choosing documents by
index (``simple_evaluate(samples=...)``) gives every RULER length its share of ``--samples``:
lm-eval 0.4.13's RULER tasks take the lengths as task metadata ``max_seq_lengths`` and generate
500 documents per length, one length after another (``niah_utils.py``: ``generate_samples(...,
max_seq_length=seq, num_samples=500) for seq in seq_lengths``), each with a ``max_length``
field; ``limit=N`` would take the first N, all of the first length.

Offline: in lm-eval 0.4.13 ``niah_single_1``, ``niah_multikey_2``, ``niah_multikey_3``,
``ruler_vt``, ``ruler_cwe`` and ``ruler_fwe`` generate their documents locally; the essay NIAH
tasks (``baber/paul_graham_essays``), ``ruler_qa_squad``/``ruler_qa_hotpot``, LongBench and
most other tasks read hub datasets, which fail offline with one ``error:`` line naming the
dataset. Results are read by :mod:`.results`.
"""

from __future__ import annotations

import os
import re
from typing import Any

from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation.core.config import EvalConfig

__all__ = ["LM_EVAL_TASK", "lm_eval_task_names", "pick_documents", "load_tasks"]

#: Our task names -> lm-eval's (the rest are passed as given).
LM_EVAL_TASK = {"vt": "ruler_vt", "cwe": "ruler_cwe", "fwe": "ruler_fwe",
                "qa_1": "ruler_qa_squad", "qa_2": "ruler_qa_hotpot"}

_UNREACHABLE = re.compile(r"Couldn't reach '([^']+)'")


def lm_eval_task_names(tasks: list[str]) -> list[str]:
    """lm-eval task names for ours (``ruler`` = lm-eval's 13-task group)."""
    return list(dict.fromkeys(LM_EVAL_TASK.get(t, t) for t in tasks))


def pick_documents(docs: Any, *, samples: int | None, lengths: list[int],
                   task: str) -> list[int] | None:
    """Indices of the documents to evaluate: the first ``samples`` of every length for a task
    whose documents carry RULER's ``max_length`` field, else the first ``samples``; ``None`` =
    all. A requested length with no document is refused (lm-eval skips lengths too short for a
    task's template)."""
    first = docs[0] if len(docs) else {}
    if isinstance(first, dict) and "max_length" in first:
        by_length: dict[int, list[int]] = {}
        for i, doc in enumerate(docs):
            by_length.setdefault(int(doc["max_length"]), []).append(i)
        missing = [n for n in lengths if not by_length.get(n)]
        if missing:
            raise UserError(f"--lengths {','.join(map(str, missing))}: lm-eval generated no "
                            f"{task} document at that length; give longer --lengths")
        if samples is None:
            return None
        return [i for n in lengths for i in by_length[n][:samples]]
    if not len(docs):
        raise UserError(f"--tasks {task}: lm-eval's task has no documents to evaluate; check "
                        "its data files")
    return None if samples is None else list(range(min(samples, len(docs))))


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _build(tm: Any, name: str) -> list[Any]:
    """lm-eval's Task/Group objects of one ``--tasks`` name (data downloaded or generated now,
    so every data failure is one line naming the task, before the model loads)."""
    try:
        loaded = tm.load(name)
    except ConnectionError as exc:
        m = _UNREACHABLE.search(str(exc))
        dataset = m.group(1) if m else _first_line(exc)
        raise UserError(
            f"--tasks {name}: lm-eval needs the dataset {dataset} from the Hugging Face hub, "
            "which is unreachable (offline?); put a copy in the HF datasets cache "
            "(HF_DATASETS_CACHE) or point --lm-eval-include at a task YAML whose "
            "dataset_path/data_files name a local copy") from None
    except ImportError as exc:
        raise UserError(f"--tasks {name}: lm-eval's task needs more packages "
                        f"({_first_line(exc)})") from None
    except ValueError as exc:
        raise UserError(f"--tasks {name} --lengths: lm-eval cannot build the task "
                        f"({_first_line(exc)})") from None
    except (KeyError, TypeError, FileNotFoundError) as exc:
        raise UserError(f"--tasks {name}: lm-eval cannot build the task "
                        f"({_first_line(exc)}); check its YAML and data files") from None
    if name in loaded["groups"]:
        return [loaded["groups"][name]]
    return list(loaded["tasks"].values())  # a task, or a tag's tasks


def _task_manager(cfg: EvalConfig) -> Any:
    """lm-eval's ``TaskManager`` over its own tasks plus ``--lm-eval-include``; metadata carry
    the model directory (RULER sizes its prompts with its tokenizer) and the lengths."""
    from lm_eval.tasks import TaskManager

    for path in cfg.lm_eval_include:
        if not os.path.exists(path):
            raise UserError(f"--lm-eval-include {path}: no such file or directory; give a "
                            "directory of lm-eval task YAMLs (or one YAML)")
    meta = {"pretrained": cfg.hf_dir, "tokenizer": cfg.hf_dir,
            "max_seq_lengths": list(cfg.lengths)}
    if cfg.lm_eval_include:
        # every asked-for task a leaf task in --lm-eval-include: lm-eval's own ~10k task files
        # need not be indexed (~10 s). A group or tag may name built-in tasks: full index.
        own = TaskManager(include_path=list(cfg.lm_eval_include), include_defaults=False,
                          metadata=meta)
        if all(name in own.all_subtasks for name in lm_eval_task_names(cfg.tasks)):
            return own
    return TaskManager(include_path=list(cfg.lm_eval_include) or None, metadata=meta)


def load_tasks(cfg: EvalConfig) -> tuple[Any, list[Any], dict[str, list[int]], list[str]]:
    """TaskManager, top-level task objects, chosen document indices per leaf task, and the
    leaf task names, for ``cfg.tasks``."""
    tm = _task_manager(cfg)
    names = lm_eval_task_names(cfg.tasks)
    for name in names:
        if name not in tm.all_tasks and not name.endswith((".yaml", ".yml")):
            where = (f" or under --lm-eval-include {','.join(cfg.lm_eval_include)}"
                     if cfg.lm_eval_include else "; a local task needs --lm-eval-include DIR")
            raise UserError(f"--tasks {name}: not an lm-eval task (none registered by that "
                            f"name{where}); see `lm-eval ls tasks`")
    objects = [obj for name in names for obj in _build(tm, name)]
    loaded = tm.load(objects)  # flattens groups without building anything again
    picks: dict[str, list[int]] = {}
    for task_name, task in loaded["tasks"].items():
        idx = pick_documents(task.eval_docs, samples=cfg.samples, lengths=cfg.lengths,
                             task=task_name)
        if idx is not None:  # absent = all documents
            picks[task_name] = idx
    return tm, objects, picks, list(loaded["tasks"])
