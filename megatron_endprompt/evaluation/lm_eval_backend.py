"""``--backend lm-eval``: the full 13-task RULER of lm-evaluation-harness on the HF export.

For users with internet access (lm-eval's RULER downloads Paul Graham's essays, SQuAD and
HotpotQA): ``pip install "megatron-endprompt[lm-eval]"``. Our own RULER tasks stay the offline
default. lm-eval names the tasks ``niah_single_1`` ... ``niah_multiquery``, ``ruler_vt``,
``ruler_cwe``, ``ruler_fwe``, ``ruler_qa_squad``, ``ruler_qa_hotpot`` (group ``ruler``), takes
the lengths as task metadata ``max_seq_lengths`` and reports one metric per length (``"4096"``,
fraction correct, ``-1`` where a length has no sample).
"""

from __future__ import annotations

from typing import Any

from megatron_endprompt.errors import UserError

__all__ = ["LM_EVAL_TASK", "run_lm_eval", "lm_eval_task_names"]

#: Our task names -> lm-eval's.
LM_EVAL_TASK = {"vt": "ruler_vt", "cwe": "ruler_cwe", "fwe": "ruler_fwe",
                "qa_1": "ruler_qa_squad", "qa_2": "ruler_qa_hotpot"}


def lm_eval_task_names(tasks: list[str]) -> list[str]:
    """lm-eval task names for ours (``ruler`` = lm-eval's 13-task group)."""
    return [LM_EVAL_TASK.get(t, t) for t in tasks]


def run_lm_eval(*, hf_dir: str, tasks: list[str], lengths: list[int], device: str, dtype: str,
                batch_size: int, samples: int | None = None,
                seed: int = 42) -> dict[str, Any]:
    """Run lm-eval's ``simple_evaluate`` and return ``{"backend", "lm_eval_version", "tasks":
    {task: {"scores": {length: percent}}}, "ruler": {"average": ...}}``."""
    try:
        import lm_eval
    except ImportError:
        raise UserError("--backend lm-eval needs lm-evaluation-harness: pip install "
                        "'megatron-endprompt[lm-eval]' (or pip install lm-eval)") from None
    names = lm_eval_task_names(tasks)
    metadata: dict[str, Any] = {"max_seq_lengths": list(lengths), "pretrained": hf_dir}
    out = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": hf_dir, "dtype": dtype, "max_length": max(lengths)},
        tasks=names, batch_size=batch_size, device=device, metadata=metadata,
        limit=samples * len(lengths) if samples else None,  # lm-eval: documents per task
        random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed)
    if not out or "results" not in out:
        raise UserError("--backend lm-eval: lm-eval returned no results (is the model "
                        "directory readable and the task data reachable?)")
    table: dict[str, Any] = {}
    for task, metrics in out["results"].items():
        scores = {}
        for n in lengths:
            v = metrics.get(f"{n},none", metrics.get(str(n)))
            scores[str(n)] = None if v is None or v == -1 else round(100 * float(v), 2)
        if any(v is not None for v in scores.values()):
            table[task] = {"scores": scores, "exact_ruler": True, "ruler": True,
                           "haystack": "lm-eval (downloads)"}
    avg: dict[str, float | None] = {}
    for n in lengths:
        vals = [t["scores"][str(n)] for t in table.values() if t["scores"][str(n)] is not None]
        avg[str(n)] = round(sum(vals) / len(vals), 2) if vals else None
    return {"backend": "lm-eval", "lm_eval_version": getattr(lm_eval, "__version__", None),
            "tasks": table, "ruler": {"tasks_run": list(table), "average": avg,
                                      "exact_ruler_tasks": list(table),
                                      "substitute_haystack_tasks": []}}
