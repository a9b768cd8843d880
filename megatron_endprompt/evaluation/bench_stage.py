"""The benchmark stage of an evaluation run (after RULER / passkey / perplexity): LongBench
and short-text retention on the model already loaded, at the run's largest length, each
written into the results (and the reports rewritten) as it finishes; plus the file checks that
run before the model loads."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from megatron_endprompt.evaluation.core.config import EvalConfig
from megatron_endprompt.evaluation.report import tables as report
from megatron_endprompt.evaluation.longbench.run import available_tasks, load_task, run_longbench
from megatron_endprompt.evaluation.short_text.mmlu import load_mmlu
from megatron_endprompt.evaluation.short_text.run import run_short_text

__all__ = ["check_files", "run"]


def check_files(cfg: EvalConfig) -> None:
    """LongBench and MMLU files are readable and well-formed (before the model loads)."""
    if cfg.longbench_dir:
        for task in available_tasks(cfg.longbench_dir, cfg.longbench_e):
            load_task(cfg.longbench_dir, task, cfg.bench_limit, cfg.longbench_e)
    if cfg.short_text_dir and os.path.isfile(os.path.join(cfg.short_text_dir,
                                                          "mmlu_test.jsonl")):
        load_mmlu(cfg.short_text_dir)


def run(cfg: EvalConfig, model: Any, tokenizer: Any, results: dict[str, Any],
        bar: Any, start: float, prompts_file: Any = None) -> None:
    """LongBench at each of ``longbench_lengths`` (default: the largest length; the largest
    context is ``results["longbench"]``, every one under ``longbench_by_length``) and
    short-text retention at the largest length, into ``results``; lm-eval's
    per-sample log of the short-text run goes to ``prompts_file`` (``--save-prompts``) when
    given, one JSON line per document, not into the results."""
    length = max(cfg.lengths)
    if cfg.longbench_dir:
        contexts = sorted(cfg.longbench_lengths or [length])
        for n in contexts:
            got = run_longbench(model, tokenizer, cfg.longbench_dir, length=n,
                                limit=cfg.bench_limit, batch_size=cfg.batch_size, progress=bar,
                                chat=cfg.chat_template == "model", e=cfg.longbench_e)
            if len(contexts) > 1:
                results.setdefault("longbench_by_length", {})[str(n)] = {
                    k: v for k, v in got.items() if k != "samples"}
            results["longbench"] = got  # the largest context last: the paper table's
            results["meta"]["elapsed_s"] = round(time.time() - start, 2)
            report.write_tables(results, cfg.output)
    if cfg.short_text_dir:
        results["short_text"] = run_short_text(model, tokenizer, cfg.short_text_dir,
                                               length=length, batch_size=cfg.batch_size,
                                               limit=cfg.bench_limit, seed=cfg.lm_eval_seed,
                                               progress=bar, chat=cfg.chat_template == "model")
        samples = results["short_text"].pop("lm_eval_samples", [])
        if prompts_file is not None:
            for rec in samples:
                prompts_file.write(json.dumps({"benchmark": "short_text", **rec},
                                              default=str) + "\n")
            prompts_file.flush()
        results["meta"]["elapsed_s"] = round(time.time() - start, 2)
        report.write_tables(results, cfg.output)
