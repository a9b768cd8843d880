"""The evaluation pipeline of ``tools/eval_longcontext.py``: validate, build prompts, run the
model, score, and write the reports as each task x length finishes.

``EvalConfig`` holds every choice (the CLI only parses flags into it); ``run_eval(config)``
runs it and returns the results dict that ``report`` writes. Outputs are checked to be
writable before anything runs; the JSON and markdown are rewritten (atomically) after every
task x length, so an interrupted 64K run keeps what finished; non-finite numbers are written as
``null``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation import bench_stage, task_table
from megatron_endprompt.evaluation.core import chat, runner
from megatron_endprompt.evaluation.core.config import EvalConfig
from megatron_endprompt.evaluation.core.prompt import TextTokens
from megatron_endprompt.evaluation.core.results_io import check_writable
from megatron_endprompt.evaluation.core.task import GenerationTask, TaskContext
from megatron_endprompt.evaluation.lm_eval_run import run_lm_eval_backend
from megatron_endprompt.evaluation.perplexity import windows as perplexity
from megatron_endprompt.evaluation.report import tables as report
from megatron_endprompt.evaluation.ruler.tasks import ESSAY_HAYSTACK
from megatron_endprompt.evaluation.task_table import resolve_tasks

__all__ = ["EvalConfig", "check_config", "evaluate", "run_eval", "resolve_tasks",
           "MAX_LENGTH_FACTOR", "check_writable"]

#: Longest evaluation length, in multiples of the model's ``max_position_embeddings``: the
#: paper's longest evaluation is 8x a window (8K base models at 64K); 16x leaves one doubling
#: for extrapolation studies. Past it the positions are far from anything trained and the run
#: (attention memory grows with the square of the length) is cost without a comparable number.
MAX_LENGTH_FACTOR = 16


def check_config(cfg: EvalConfig) -> None:
    """Every refusal of ``cfg`` before the tokenizer loads: the flags themselves
    (``EvalConfig.validate``) and what the run's tasks need of them (the task table)."""
    cfg.validate()
    task_table.check_flags(cfg)


def evaluate(cfg: EvalConfig) -> dict[str, Any]:
    """Check ``cfg`` and run it on its backend (native: :func:`run_eval`; ``lm-eval``:
    ``lm_eval_run.run_lm_eval_backend``); returns the results dict."""
    check_config(cfg)
    return _BACKENDS[cfg.backend](cfg)


def _prompts(row: GenerationTask, length: int, ctx: TaskContext) -> list[Any]:
    """The prompt samples of one task at one length."""
    try:
        return row.build(ctx, row.name, length)
    except ValueError as exc:
        raise UserError(f"--lengths {length}: {exc}") from None


def _check_lengths(cfg: EvalConfig, rows: list[GenerationTask], ctx: TaskContext) -> None:
    """Every task's length rule holds at every length (checked before the model loads)."""
    for length in cfg.lengths:
        try:
            for row in rows:
                if row.check_length is not None:
                    row.check_length(ctx, row.name, length)
        except ValueError as exc:
            raise UserError(f"--lengths {length}: {exc}") from None


def _load_resources(rows: list[GenerationTask], ctx: TaskContext) -> TaskContext:
    """``ctx`` with every resource the rows name, each loaded once."""
    loaded = {name: res.load(ctx, tasks)
              for name, (res, tasks) in task_table.resources_of(rows).items()}
    return dataclasses.replace(ctx, resources=loaded)


def run_eval(cfg: EvalConfig, *, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``cfg`` and write its reports; returns the results dict."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    check_config(cfg)
    paths = report.output_paths(cfg.output)
    # probe only: the directories are created once every input below has been validated
    check_writable(paths["json"], flag="--output", create=False)
    if cfg.save_prompts:
        check_writable(cfg.save_prompts, flag="--save-prompts", create=False)
    meta = runner.model_meta(cfg.hf_dir)
    mpe = meta["max_position_embeddings"]
    over = [n for n in cfg.lengths if mpe and n > MAX_LENGTH_FACTOR * mpe]
    if over:
        raise UserError(f"--lengths {','.join(map(str, over))}: more than {MAX_LENGTH_FACTOR}x "
                        f"the model's max_position_embeddings ({mpe}, so at most "
                        f"{MAX_LENGTH_FACTOR * mpe}); give lengths up to that")

    import transformers  # only here: transformers is slow to import; flags are checked first

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    tokenizer = runner.load_tokenizer(cfg.hf_dir)
    chat.check_setting(cfg.chat_template, cfg.hf_dir, tokenizer, log)
    rows = task_table.rows_of(cfg.tasks)
    base_tasks = [row.name for row in rows] if cfg.chat_template == "model" else []
    if base_tasks:
        log(chat.base_tasks_note(base_tasks))
    ctx = _load_resources(rows, TaskContext(cfg=cfg, tokens=TextTokens(tokenizer)))
    haystack = ctx.resources.get(ESSAY_HAYSTACK.name)  # the reports name it
    docs = texts = None
    if task_table.PPL in cfg.tasks:
        texts = perplexity.load_documents(cfg.ppl_data or "", key=cfg.ppl_key)
        docs = perplexity.tokenize_documents(tokenizer, texts,
                                             max_tokens=cfg.ppl_doc_tokens or None)
        longest = max(len(d) for d in docs)
        if cfg.ppl_protocol == "document" and longest < min(cfg.lengths):
            raise UserError(f"--ppl-data {cfg.ppl_data}: the longest document has {longest} "
                            f"tokens, fewer than the shortest length ({min(cfg.lengths)}); "
                            "give longer documents")
    _check_lengths(cfg, rows, ctx)
    bench_stage.check_files(cfg)
    long = [n for n in cfg.lengths if mpe and n > mpe]
    if long:
        log(f"warning: --lengths {','.join(map(str, long))} exceed the model's "
            f"max_position_embeddings ({mpe}); evaluating anyway")

    import torch  # only here: torch costs seconds at start-up; every check above runs first
    from tqdm import tqdm

    torch.manual_seed(cfg.seed)
    for path in (paths["json"], cfg.save_prompts):  # everything validated: now create
        if path:
            check_writable(path, flag="--output" if path == paths["json"] else "--save-prompts")
    start = time.time()
    model = runner.load_model(cfg.hf_dir, device=cfg.device, dtype=cfg.dtype,
                              attn_implementation=cfg.attn_implementation)
    results: dict[str, Any] = {"meta": {
        "hf_dir": cfg.hf_dir, "tasks": cfg.tasks, "lengths": cfg.lengths, "depths": cfg.depths,
        "samples": cfg.samples, "seed": cfg.seed, "device": cfg.device, "dtype": cfg.dtype,
        "batch_size": cfg.batch_size, "bench_limit": cfg.bench_limit,
        "chat_template": cfg.chat_template, "chat_template_base_tasks": base_tasks,
        "tokenizer_chat_template": bool(getattr(tokenizer, "chat_template", None)), **meta}}
    if haystack is not None:
        results["meta"]["haystack"] = {"source": haystack.source,
                                       "substitute": haystack.substitute,
                                       "chars": haystack.chars, "sha256": haystack.sha256}
    prompts_file = open(cfg.save_prompts, "w", encoding="utf-8") if cfg.save_prompts else None
    records: list[dict[str, Any]] = []
    try:
        with tqdm(disable=not cfg.progress, desc="eval", unit="prompt", file=sys.stderr,
                  dynamic_ncols=True) as bar:
            scorers = {row.name: row.scorer for row in rows}
            for row in rows:
                for length in cfg.lengths:
                    bar.set_description(f"{row.name}@{length} prompts")
                    samples = _prompts(row, length, ctx)
                    bar.total = (bar.total or 0) + len(samples)
                    bar.set_description(f"{row.name}@{length}")
                    recs = runner.run_generation(model, tokenizer, samples,
                                                 batch_size=cfg.batch_size, progress=bar,
                                                 scorers=scorers)
                    records.extend(recs)
                    if prompts_file is not None:
                        for r in recs:
                            prompts_file.write(json.dumps(report.finite(
                                {k: r[k] for k in ("task", "length", "index", "depth",
                                                   "prompt", "answer", "output", "score")}))
                                               + "\n")
                        prompts_file.flush()
                    for r in recs:  # prompts are long: keep them only in --save-prompts
                        r.pop("prompt", None)
                    results.update(report.summarize(records, haystack, cfg.depths))
                    results["meta"]["elapsed_s"] = round(time.time() - start, 2)
                    report.write_tables(results, cfg.output)
            if docs is not None:
                _run_ppl(cfg, model, tokenizer, texts or [], docs, results, bar, start)
            bench_stage.run(cfg, model, tokenizer, results, bar, start, prompts_file)
    finally:
        if prompts_file is not None:
            prompts_file.close()
    results["meta"]["elapsed_s"] = round(time.time() - start, 2)
    results["written"] = report.write_reports(results, cfg.output)
    return results


def _run_ppl(cfg: EvalConfig, model: Any, tokenizer: Any, texts: list[str], docs: list[Any],
             results: dict[str, Any], bar: Any, start: float) -> None:
    """Perplexity at every length into ``results["ppl"]``, tables rewritten after each."""
    by_length: dict[str, Any] = {}
    legacy_ppl = cfg.ppl_protocol == "legacy-stream"
    results["ppl"] = {"data": cfg.ppl_data, "stride": cfg.ppl_stride,
                      "doc_tokens": cfg.ppl_doc_tokens or None,
                      "max_windows": cfg.ppl_max_windows or None,
                      "protocol": "legacy: EOS-joined stream, every token" if legacy_ppl
                      else "per document, BOS first, sliding window, new tokens only "
                      "(PoSE/LongLoRA)",
                      "by_length": by_length}
    cap = cfg.ppl_max_windows or None
    for n in cfg.lengths:
        bar.set_description(f"ppl@{n}")
        if legacy_ppl:
            by_length[str(n)] = perplexity.run_stream_perplexity(
                model, tokenizer, texts, length=n, stride=cfg.ppl_stride, max_windows=cap,
                progress=bar)
        else:
            bar.total = (bar.total or 0) + perplexity.count_windows(
                docs, length=n, stride=cfg.ppl_stride, max_windows=cap)
            by_length[str(n)] = perplexity.run_doc_perplexity(
                model, docs, length=n, stride=cfg.ppl_stride, max_windows=cap, progress=bar)
        results["meta"]["elapsed_s"] = round(time.time() - start, 2)
        report.write_tables(results, cfg.output)


#: ``EvalConfig.backend`` -> the pipeline that runs it.
_BACKENDS: dict[str, Callable[[EvalConfig], dict[str, Any]]] = {
    "native": run_eval, "lm-eval": run_lm_eval_backend}
