"""Short-text retention: MMLU, GSM8K and HellaSwag through lm-eval on local files, HumanEval
natively (``humaneval``).

lm-eval's own task definitions are kept and only the data source changes: for each benchmark we
write a task YAML (into a temporary ``include_path``) that copies the fields of lm-eval 0.4.13's
``gsm8k/gsm8k.yaml`` and ``hellaswag/hellaswag.yaml`` (prompt, choices, target, metrics,
filters, few-shot split) with ``dataset_path: json`` and ``data_files`` pointing at local JSONL;
MMLU is lm-eval's per-subject tasks and group (``mmlu_tasks``: subject description, same-subject
shots, acc over every question). HellaSwag's ``process_docs`` is lm-eval's own
``lm_eval.tasks.hellaswag.utils.process_docs`` (re-exported by a one-line module beside the
YAML). The model object already loaded is handed to lm-eval's ``HFLM``.

``--short-text-dir DIR`` files (any subset; the ones absent are reported as missing):
``mmlu_test.jsonl`` (+ ``mmlu_dev.jsonl`` for 5-shot; fields ``question``, ``subject``,
``choices`` [4], ``answer`` int), ``gsm8k_test.jsonl`` (+ ``gsm8k_train.jsonl`` for 5-shot;
``question``, ``answer`` with ``#### N``), ``hellaswag_validation.jsonl`` (``ctx_a``, ``ctx_b``,
``activity_label``, ``endings`` [4], ``label``), ``humaneval.jsonl`` (HumanEval's fields).
Shots are lm-eval's defaults (MMLU 5, GSM8K 5, HellaSwag 0), fewer when the few-shot file
has fewer items (recorded under ``num_fewshot``). Headline metrics: MMLU ``acc``, GSM8K
``exact_match`` (``strict-match``), HellaSwag ``acc_norm``, HumanEval pass@1; each x 100.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation.short_text.humaneval import run_humaneval
from megatron_endprompt.evaluation.lm_eval.results import sample_records
from megatron_endprompt.evaluation.lm_eval.seeds import lm_eval_seeds
from megatron_endprompt.evaluation.short_text.mmlu import MMLU_SHOTS, write_mmlu_tasks
from megatron_endprompt.evaluation.short_text.spec import BENCHMARKS

__all__ = ["FILES", "task_yaml", "run_short_text", "average"]

#: benchmark -> (evaluation file, few-shot file or None)
FILES = {"mmlu": ("mmlu_test.jsonl", "mmlu_dev.jsonl"),
         "gsm8k": ("gsm8k_test.jsonl", "gsm8k_train.jsonl"),
         "hellaswag": ("hellaswag_validation.jsonl", None),
         "humaneval": ("humaneval.jsonl", None)}
_SHOTS = {"mmlu": MMLU_SHOTS, "gsm8k": 5, "hellaswag": 0}
#: benchmark -> (lm-eval metric key, name shown)
HEADLINE = {"mmlu": ("acc,none", "acc"), "gsm8k": ("exact_match,strict-match",
                                                   "exact_match (strict-match)"),
            "hellaswag": ("acc_norm,none", "acc_norm"), "humaneval": ("pass@1", "pass@1")}

_GSM8K = {
    "output_type": "generate_until", "test_split": "test", "fewshot_split": "train",
    "doc_to_text": "Question: {{question}}\nAnswer:", "doc_to_target": "{{answer}}",
    "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True,
                     "ignore_case": True, "ignore_punctuation": False,
                     "regexes_to_ignore": [",", "\\$", "(?s).*#### ", "\\.$"]}],
    "generation_kwargs": {"until": ["Question:", "</s>", "<|im_end|>"], "do_sample": False,
                          "temperature": 0.0},
    "repeats": 1,
    "filter_list": [
        {"name": "strict-match", "filter": [
            {"function": "regex", "regex_pattern": "#### (\\-?[0-9\\.\\,]+)"},
            {"function": "take_first"}]},
        {"name": "flexible-extract", "filter": [
            {"function": "regex", "group_select": -1,
             "regex_pattern": "(-?[$0-9.,]{2,})|(-?[0-9]+)"},
            {"function": "take_first"}]}],
}
_HELLASWAG = {
    "output_type": "multiple_choice", "test_split": "validation",
    "doc_to_text": "{{query}}", "doc_to_target": "{{label}}", "doc_to_choice": "choices",
    "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                    {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}],
}
_HELLASWAG_UTILS = "from lm_eval.tasks.hellaswag.utils import process_docs  # noqa: F401\n"


def _count(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def task_yaml(bench: str, root: str) -> tuple[str, int]:
    """``(YAML text, shots)`` of the local task ``endprompt_{bench}`` reading ``root`` (GSM8K,
    HellaSwag; MMLU: ``mmlu_tasks``)."""
    test, shots_file = FILES[bench]
    files = {"validation" if bench == "hellaswag" else "test": os.path.join(root, test)}
    shots = _SHOTS[bench]
    if shots_file is not None:
        path = os.path.join(root, shots_file)
        have = _count(path) if os.path.isfile(path) else 0
        shots = min(shots, have)
        if have:
            files["train"] = path
    body = dict({"gsm8k": _GSM8K, "hellaswag": _HELLASWAG}[bench])
    if not shots:
        body.pop("fewshot_split", None)
        body.pop("fewshot_config", None)
    head = {"task": f"endprompt_{bench}", "dataset_path": "json",
            "dataset_kwargs": {"data_files": files}, "num_fewshot": shots,
            "metadata": {"version": 1.0}}
    text = json.dumps({**head, **body}, indent=1)  # JSON is YAML
    if bench == "hellaswag":
        text = text.rstrip()[:-1].rstrip() + ',\n "process_docs": !function ' \
            'endprompt_hellaswag_utils.process_docs\n}\n'
    return text, shots


def _lm_eval(model: Any, tokenizer: Any, root: str, benches: list[str], *, length: int,
             batch_size: int, limit: int, seed: int | None,
             chat: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise UserError("--short-text-dir needs lm-evaluation-harness: pip install "
                        "'lm-eval[hf]'") from None
    if "gsm8k" in benches and length <= 256:
        raise UserError(f"--lengths {length}: GSM8K generates up to 256 tokens (lm-eval's "
                        "max_gen_toks) after its few-shot prompt; use a length of 1024 or more")
    with tempfile.TemporaryDirectory(prefix="endprompt_tasks_") as inc:
        shots: dict[str, Any] = {}
        names = {}
        for b in benches:
            if b == "mmlu":
                mmlu = write_mmlu_tasks(root, inc)
                names[b], shots[b] = mmlu["group"], min(mmlu["shots"].values())
                shots["mmlu_by_subject"] = mmlu["shots"]
                continue
            names[b] = f"endprompt_{b}"
            text, shots[b] = task_yaml(b, root)
            with open(os.path.join(inc, f"endprompt_{b}.yaml"), "w", encoding="utf-8") as f:
                f.write(text)
        with open(os.path.join(inc, "endprompt_hellaswag_utils.py"), "w") as f:
            f.write(_HELLASWAG_UTILS)
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size,
                  max_length=length)
        # the task YAMLs above are self-contained: lm-eval's own ~10k task files are not
        # indexed (include_defaults=False spares ~10 s per run; the tasks are the same)
        out = lm_eval.simple_evaluate(
            model=lm, tasks=[names[b] for b in benches],
            task_manager=TaskManager(include_path=inc, include_defaults=False),
            limit=limit or None,
            **lm_eval_seeds(seed), apply_chat_template=chat)
    results = (out or {}).get("results", {})
    table = {}
    for b in benches:
        got = results.get(names[b])
        key, shown = HEADLINE[b]
        if not got or not isinstance(got.get(key), (int, float)):
            raise UserError(f"--short-text-dir: lm-eval gave no {shown} for {b} "
                            f"({os.path.join(root, FILES[b][0])}); check the file's fields")
        metrics = {k: v for k, v in got.items() if isinstance(v, (int, float))}
        counts = (out or {}).get("n-samples") or {}
        leaves = [t for t in counts if t == names[b] or t.startswith(names[b] + "_")]
        items = sum(int(counts[t].get("effective", 0)) for t in leaves)
        table[b] = {"score": round(100 * float(got[key]), 2), "metric": shown, "items": items,
                    "num_fewshot": shots[b], "lm_eval_metrics": metrics,
                    "source": "lm-eval " + getattr(lm_eval, "__version__", "?")}
        if b == "mmlu":
            table[b]["num_fewshot_by_subject"] = shots["mmlu_by_subject"]
            table[b]["aggregation"] = ("lm-eval's: acc over every question (subjects "
                                       "weighted by size)")
    return table, sample_records(out or {})


def average(table: dict[str, Any]) -> float | None:
    """Mean of the headline scores run (0-100)."""
    vals = [v["score"] for v in table.values()]
    return round(sum(vals) / len(vals), 2) if vals else None


def run_short_text(model: Any, tokenizer: Any, root: str, *, length: int, batch_size: int = 1,
                   limit: int = 0, seed: int | None = None, progress: Any = None,
                   chat: bool = False) -> dict[str, Any]:
    """Every benchmark whose file is in ``root``; ``{"benchmarks": {name: {"score", ...}},
    "average", "missing", "complete", "chat_template", "lm_eval_samples"}`` (the last: lm-eval's
    per-sample log, ``lm_eval_results.sample_records``, for ``--save-prompts``)."""
    if not os.path.isdir(root):
        raise UserError(f"--short-text-dir {root}: no such directory")
    have = [b for b in BENCHMARKS if os.path.isfile(os.path.join(root, FILES[b][0]))]
    if not have:
        raise UserError(f"--short-text-dir {root}: none of "
                        f"{', '.join(FILES[b][0] for b in BENCHMARKS)}")
    table: dict[str, Any] = {}
    via_lm_eval = [b for b in have if b != "humaneval"]
    samples: list[dict[str, Any]] = []
    if via_lm_eval:
        got, samples = _lm_eval(model, tokenizer, root, via_lm_eval, length=length,
                                batch_size=batch_size, limit=limit, seed=seed, chat=chat)
        table.update(got)
    if "humaneval" in have:
        he = run_humaneval(model, tokenizer, os.path.join(root, FILES["humaneval"][0]),
                           length=length, limit=limit, progress=progress, chat=chat)
        table["humaneval"] = {"score": he["pass@1"], "metric": "pass@1", "num_fewshot": 0,
                              "items": he["problems"],
                              **{k: he[k] for k in ("passed", "problems", "samples",
                                                    "sandbox", "timeout_s")}, "source": "native"}
    ordered = {b: table[b] for b in BENCHMARKS if b in table}
    missing = [b for b in BENCHMARKS if b not in table]
    return {"dir": root, "benchmarks": ordered, "average": average(ordered),
            "missing": missing, "complete": not missing,
            "chat_template": "model" if chat else "none", "lm_eval_samples": samples,
            "lm_eval_seeds": lm_eval_seeds(seed) if via_lm_eval else None}
