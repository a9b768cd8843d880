"""The ``--backend lm-eval`` run: validate, build lm-eval's tasks (``lm_eval.tasks``), run them
on the HF directory with lm-eval's own HF model and write ``FILE.json`` / ``FILE.md`` (and the
per-sample log for ``--save-prompts``).

A pipeline like ``suite.run_eval``, so it sits on the top floor: it reads lm-eval's results
(``lm_eval.results``) and writes the reports (``report``)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from megatron_endprompt.disk import write_text
from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation.core import chat, runner
from megatron_endprompt.evaluation.core.config import EvalConfig
from megatron_endprompt.evaluation.core.results_io import check_writable
from megatron_endprompt.evaluation.lm_eval.results import read_results, sample_records
from megatron_endprompt.evaluation.lm_eval.seeds import lm_eval_seeds
from megatron_endprompt.evaluation.lm_eval.tasks import load_tasks
from megatron_endprompt.evaluation.report import tables as report

__all__ = ["run_lm_eval_backend"]


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
    meta = runner.model_meta(cfg.hf_dir)
    tm, objects, picks, leaves = load_tasks(cfg)
    start = time.time()
    out = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": cfg.hf_dir, "dtype": cfg.dtype,
                    "max_length": max(cfg.lengths)},
        tasks=objects, task_manager=tm, samples=picks or None, batch_size=cfg.batch_size,
        device=cfg.device, **lm_eval_seeds(cfg.lm_eval_seed),
        apply_chat_template=cfg.chat_template == "model", log_samples=bool(cfg.save_prompts))
    if not out or "results" not in out:
        raise UserError("--backend lm-eval: lm-eval returned no results (is the model "
                        "directory readable?)")
    results: dict[str, Any] = {"meta": {
        "hf_dir": cfg.hf_dir, "tasks": cfg.tasks, "lm_eval_tasks": leaves,
        "lm_eval_include": cfg.lm_eval_include, "lengths": cfg.lengths,
        "samples": cfg.samples, "seed": cfg.seed,
        "lm_eval_seeds": lm_eval_seeds(cfg.lm_eval_seed),
        "device": cfg.device, "dtype": cfg.dtype,
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
