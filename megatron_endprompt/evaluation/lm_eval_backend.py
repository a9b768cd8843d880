"""``--backend lm-eval``: any lm-evaluation-harness task (registered or local) on the HF export.

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
dataset. Results are read by :mod:`.lm_eval_results`.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

from megatron_endprompt.disk import write_text
from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation import report
from megatron_endprompt.evaluation import chat, runner
from megatron_endprompt.evaluation.lm_eval_results import read_results, sample_records
from megatron_endprompt.evaluation.results_io import check_writable
from megatron_endprompt.evaluation.suite import EvalConfig, model_meta

__all__ = ["LM_EVAL_TASK", "lm_eval_task_names", "pick_documents", "run_lm_eval_backend"]

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
    return TaskManager(include_path=list(cfg.lm_eval_include) or None,
                       metadata={"pretrained": cfg.hf_dir, "tokenizer": cfg.hf_dir,
                                 "max_seq_lengths": list(cfg.lengths)})


def _load(cfg: EvalConfig) -> tuple[Any, list[Any], dict[str, list[int]], list[str]]:
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


def run_lm_eval_backend(cfg: EvalConfig) -> dict[str, Any]:
    """Validate, build lm-eval's tasks, run them on ``cfg.hf_dir`` and write ``FILE.json`` and
    ``FILE.md``; returns the results dict (``tasks``: every task's metrics; ``ruler``: the
    per-length average over the RULER tasks run)."""
    cfg.validate()
    paths = report.output_paths(cfg.output)
    # a probe only: write_tables creates the directory when there are results to write
    check_writable(paths["json"], flag="--output", create=False)
    if cfg.save_prompts:
        check_writable(cfg.save_prompts, flag="--save-prompts", create=False)
    try:
        import lm_eval
    except ImportError:
        raise UserError("--backend lm-eval needs lm-evaluation-harness: pip install "
                        "'megatron-endprompt[lm-eval]' (lm-eval[hf,ruler])") from None
    tokenizer = runner.load_tokenizer(cfg.hf_dir)  # one line for missing files, not lm-eval's
    chat.check_setting(cfg.chat_template, cfg.hf_dir, tokenizer,
                       lambda m: print(m, file=sys.stderr))
    meta = model_meta(cfg.hf_dir)
    tm, objects, picks, leaves = _load(cfg)
    start = time.time()
    out = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": cfg.hf_dir, "dtype": cfg.dtype,
                    "max_length": max(cfg.lengths)},
        tasks=objects, task_manager=tm, samples=picks or None, batch_size=cfg.batch_size,
        device=cfg.device, random_seed=cfg.seed, numpy_random_seed=cfg.seed,
        torch_random_seed=cfg.seed, fewshot_random_seed=cfg.seed,
        apply_chat_template=cfg.chat_template == "model", log_samples=bool(cfg.save_prompts))
    if not out or "results" not in out:
        raise UserError("--backend lm-eval: lm-eval returned no results (is the model "
                        "directory readable?)")
    results: dict[str, Any] = {"meta": {
        "hf_dir": cfg.hf_dir, "tasks": cfg.tasks, "lm_eval_tasks": leaves,
        "lm_eval_include": cfg.lm_eval_include, "lengths": cfg.lengths,
        "samples": cfg.samples, "seed": cfg.seed, "device": cfg.device, "dtype": cfg.dtype,
        "backend": "lm-eval", "lm_eval_version": getattr(lm_eval, "__version__", None),
        "chat_template": cfg.chat_template,
        "tokenizer_chat_template": bool(getattr(tokenizer, "chat_template", None)), **meta}}
    results.update(read_results(out, leaves=leaves, lengths=cfg.lengths))
    results["meta"]["elapsed_s"] = round(time.time() - start, 2)
    results["written"] = report.write_tables(results, cfg.output)
    if cfg.save_prompts:
        check_writable(cfg.save_prompts, flag="--save-prompts")
        write_text(cfg.save_prompts, "".join(json.dumps(r, default=str) + "\n"
                                             for r in sample_records(out)))
        results["written"].append(cfg.save_prompts)
    return results
