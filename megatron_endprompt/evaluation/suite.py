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
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation import bench_stage, chat
from megatron_endprompt.evaluation import legacy_tasks as old
from megatron_endprompt.evaluation import passkey, perplexity, report, ruler, ruler_sources, runner
from megatron_endprompt.evaluation.prompt import PromptSample, TextTokens
from megatron_endprompt.evaluation.results_io import check_weights_readable, check_writable
from megatron_endprompt.evaluation.ruler_qa import QA_TASKS, make_qa_samples
from megatron_endprompt.evaluation.ruler_spec import ESSAY_TASKS, SYNTHETIC_TASKS

__all__ = ["EvalConfig", "run_eval", "resolve_tasks", "model_meta", "TASK_GROUPS", "TASK_NAMES",
           "LEGACY_TASKS", "MAX_LENGTH_FACTOR", "check_writable"]

#: Longest evaluation length, in multiples of the model's ``max_position_embeddings``: the
#: paper's longest evaluation is 8x a window (8K base models at 64K); 16x leaves one doubling
#: for extrapolation studies. Past it the positions are far from anything trained and the run
#: (attention memory grows with the square of the length) is cost without a comparable number.
MAX_LENGTH_FACTOR = 16
LEGACY_TASKS = ("legacy_passkey", "legacy_niah_single", "legacy_niah_multikey",
                "legacy_niah_multivalue", "legacy_niah_multiquery")
TASK_GROUPS: dict[str, tuple[str, ...]] = {
    "ruler": SYNTHETIC_TASKS,
    "ruler_niah": tuple(t for t in SYNTHETIC_TASKS if t.startswith("niah_")),
    "legacy": LEGACY_TASKS,
    "ruler13": (*SYNTHETIC_TASKS, *QA_TASKS),
    "none": (),
}
TASK_NAMES: tuple[str, ...] = (*TASK_GROUPS, *SYNTHETIC_TASKS, *QA_TASKS, "passkey", "ppl",
                               *LEGACY_TASKS)


@dataclass(kw_only=True)
class EvalConfig:
    """One evaluation run of an HF model directory."""

    hf_dir: str
    """HF model directory (config, weights, tokenizer), read from disk only."""
    output: str
    """``FILE.json``; ``FILE.md`` and ``FILE_*.png`` go beside it."""
    lengths: list[int]
    """Evaluation lengths in tokens (prompt + generated tokens never exceed one)."""
    tasks: list[str] = field(default_factory=lambda: list(SYNTHETIC_TASKS))
    """Task names (groups already expanded): RULER names, ``passkey``, ``ppl``, ``legacy_*``."""
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    """Passkey (and legacy) needle depths; RULER tasks place needles as RULER does."""
    samples: int | None = 5
    """Prompts per task x length (x depth for passkey); for ``backend="lm-eval"`` documents
    per task (per task x length for RULER), ``None`` = all of lm-eval's documents."""
    seed: int = 42
    """RULER's default ``--random_seed``."""
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 1
    haystack: str | None = None
    """Essay haystack file; ``None`` = the shipped public-domain substitute."""
    ppl_data: str | None = None
    """PG19-style ``.jsonl`` (or one ``.txt`` document) for ``ppl``."""
    ppl_key: str = "text"
    ppl_stride: int = 256
    ppl_doc_tokens: int = 0
    """Score only the first N tokens of each document (0 = all)."""
    ppl_max_windows: int = 0
    """At most N windows per length, evenly spread (0 = all)."""
    ppl_protocol: str = "document"
    """``document`` (PoSE/LongLoRA) or ``legacy-stream`` (EOS-joined stream, old results)."""
    attn_implementation: str | None = None
    save_prompts: str | None = None
    """JSONL: one line per prompt (task, length, prompt, answer, output, score)."""
    progress: bool = True
    backend: str = "native"
    """``native`` (our offline tasks) or ``lm-eval`` (lm-evaluation-harness's tasks)."""
    lm_eval_include: list[str] = field(default_factory=list)
    """Directories or YAML files of local lm-eval tasks (``TaskManager(include_path=...)``)."""
    qa_dir: str | None = None
    """RULER's ``squad.json`` / ``hotpotqa.json`` folder for ``qa_1`` / ``qa_2``."""
    longbench_dir: str | None = None
    """LongBench's ``data/`` folder (``{task}.jsonl``): runs LongBench at the largest length."""
    short_text_dir: str | None = None
    """MMLU / GSM8K / HellaSwag / HumanEval JSONL folder (``short_text``): runs them."""
    bench_limit: int = 0
    """At most N items per LongBench task / short-text benchmark (0 = all)."""
    longbench_lengths: list[int] = field(default_factory=list)
    """LongBench contexts (empty: the largest length); the paper table shows the largest."""
    longbench_e: bool = False
    """LongBench-E (``{task}_e.jsonl``, scores per length bucket) instead of LongBench."""
    chat_template: str = "none"
    """``none`` (prompts as base models get them) or ``model`` (the tokenizer's chat template
    for LongBench, short-text and ``--backend lm-eval``; RULER and passkey stay base)."""

    def validate(self) -> None:
        """Raise ``UserError`` naming the flag for every inconsistent choice (before anything
        is created or loaded)."""
        if self.samples is None and self.backend == "native":
            raise UserError("--samples: give a count (prompts per task x length)")
        for name, value, low in (("--samples", 1 if self.samples is None else self.samples, 1),
                                 ("--batch-size", self.batch_size, 1),
                                 ("--ppl-stride", self.ppl_stride, 1),
                                 ("--ppl-doc-tokens", self.ppl_doc_tokens, 0),
                                 ("--ppl-max-windows", self.ppl_max_windows, 0),
                                 ("--bench-limit", self.bench_limit, 0)):
            if value < low:
                raise UserError(f"{name} must be >= {low} (got {value})")
        if self.chat_template not in ("none", "model"):
            raise UserError(f"--chat-template {self.chat_template}: use none or model")
        if self.ppl_protocol not in ("document", "legacy-stream"):
            raise UserError(f"--ppl-protocol {self.ppl_protocol}: use document or "
                            "legacy-stream")
        if not self.lengths:
            raise UserError("--lengths: give at least one length")
        if not os.path.isdir(self.hf_dir):
            raise UserError(f"--hf-dir {self.hf_dir}: no such directory")
        if not os.path.isfile(os.path.join(self.hf_dir, "config.json")):
            raise UserError(f"--hf-dir {self.hf_dir}: no config.json; give an HF model "
                            "directory (e.g. the converter's output)")
        check_weights_readable(self.hf_dir)
        if any(t in QA_TASKS for t in self.tasks) and not self.qa_dir:
            raise UserError("--tasks qa_1/qa_2 need --qa-dir DIR (RULER's squad.json and "
                            "hotpotqa.json)")
        for flag, path in (("--qa-dir", self.qa_dir), ("--longbench-dir", self.longbench_dir),
                           ("--short-text-dir", self.short_text_dir)):
            if path is not None and not os.path.isdir(path):
                raise UserError(f"{flag} {path}: no such directory")
        if (self.longbench_lengths or self.longbench_e) and not self.longbench_dir:
            raise UserError("--longbench-lengths / --longbench-e need --longbench-dir DIR")
        if not self.tasks and not (self.longbench_dir or self.short_text_dir):
            raise UserError("--tasks none: give --longbench-dir or --short-text-dir, or tasks")
        if "ppl" in self.tasks and not self.ppl_data:
            raise UserError("--tasks ppl needs --ppl-data FILE (PG19-style .jsonl or .txt)")
        if self.output.endswith((".md", ".png")):
            raise UserError(f"--output {self.output}: give the JSON path (FILE.json)")
        if os.path.isdir(self.output):
            raise UserError(f"--output {self.output} is a directory; give the JSON path, e.g. "
                            f"{os.path.join(self.output, 'results.json')}")
        if self.haystack is not None and self.backend != "native":
            raise UserError("--haystack is read by the native backend only (lm-eval's essay "
                            "tasks read its own copy); drop --haystack")
        if self.haystack is not None and not any(t in ESSAY_TASKS for t in self.tasks):
            raise UserError(f"--haystack {self.haystack}: none of --tasks uses it (only "
                            f"{', '.join(ESSAY_TASKS)} read an essay haystack); drop --haystack "
                            "or add one of those tasks")
        if self.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise UserError(f"--device {self.device}: CUDA is not available here; use "
                                "--device cpu")


def resolve_tasks(text: str) -> list[str]:
    """Comma list of task names and groups -> task names (groups expanded, order kept)."""
    out: list[str] = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        if item not in TASK_NAMES:
            raise UserError(f"--tasks: unknown task {item!r}; choose from "
                            f"{', '.join(TASK_NAMES)}")
        out.extend(TASK_GROUPS.get(item, (item,)))
    if not out and "none" not in text.split(","):
        raise UserError("--tasks: give at least one task")
    return list(dict.fromkeys(out))


def model_meta(hf_dir: str) -> dict[str, Any]:
    """The model facts every report carries (type, RoPE, ``max_position_embeddings``)."""
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(hf_dir, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise UserError(f"--hf-dir {hf_dir}: cannot read config.json ({exc})") from None
    rope = getattr(cfg, "rope_parameters", None) or {
        "rope_theta": getattr(cfg, "rope_theta", None),
        "rope_scaling": getattr(cfg, "rope_scaling", None)}
    try:
        json.dumps(rope)
    except TypeError:
        rope = str(rope)
    return {"model_type": getattr(cfg, "model_type", None), "rope": rope,
            "max_position_embeddings": getattr(cfg, "max_position_embeddings", None)}


def _prompts(task: str, length: int, cfg: EvalConfig, text_tokens: Any, legacy: Any,
             haystack: Any) -> list[Any]:
    """The prompt samples of one task at one length."""
    try:
        if task in QA_TASKS:
            return make_qa_samples(task, text_tokens, qa_dir=cfg.qa_dir or "", length=length,
                                   samples=cfg.samples, seed=cfg.seed)
        if task in SYNTHETIC_TASKS:
            return ruler.make_ruler_samples(task, text_tokens, lengths=[length],
                                            samples=cfg.samples, seed=cfg.seed,
                                            haystack=haystack)
        if task == "passkey":
            return passkey.make_passkey_samples(text_tokens, lengths=[length],
                                                depths=cfg.depths, samples=cfg.samples,
                                                seed=cfg.seed)
        return _legacy_samples(task, length, cfg, legacy)
    except ValueError as exc:
        raise UserError(f"--lengths {length}: {exc}") from None


def _legacy_samples(task: str, length: int, cfg: EvalConfig, legacy: Any) -> list[Any]:
    """The pre-RULER prompts (inline passkey needle, grammar haystack), kept under
    ``legacy_*`` names for comparison with old results."""
    name = task[len("legacy_"):]
    made = old.make_samples(name, legacy["tokens"], lengths=[length], depths=cfg.depths,
                            samples=cfg.samples, seed=cfg.seed, fillers=legacy["fillers"])
    return [PromptSample(task=task, length=s.length, index=s.index, input_ids=s.input_ids,
                         answers=s.answers, metric=s.metric, max_new_tokens=s.max_new_tokens,
                         depth=s.depth) for s in made]


def _check_lengths(cfg: EvalConfig, gen_tasks: list[str], text_tokens: Any,
                   haystack: Any) -> None:
    """Every RULER / passkey task fits every length (checked before the model loads)."""
    legacy_tokens = None
    for length in cfg.lengths:
        try:
            for task in gen_tasks:
                if task in SYNTHETIC_TASKS:
                    ruler.check_length(task, text_tokens, length=length, seed=cfg.seed,
                                       haystack=haystack)
                elif task in LEGACY_TASKS:
                    legacy_tokens = legacy_tokens or old.PromptTokens(text_tokens.tokenizer)
                    over = old.prompt_overhead(task[len("legacy_"):], legacy_tokens)
                    if length <= over:
                        raise ValueError(f"{task}: too short; its prompt without haystack "
                                         f"takes {over} tokens")
            if "passkey" in gen_tasks:
                need = text_tokens.count(passkey.passkey_prompt(50000, 0, 0.5))
                if need + passkey.MAX_NEW_TOKENS > length:
                    raise ValueError(f"passkey: length {length} is too short (the prompt "
                                     f"without garbage takes {need} tokens)")
        except ValueError as exc:
            raise UserError(f"--lengths {length}: {exc}") from None


def run_eval(cfg: EvalConfig, *, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``cfg`` and write its reports; returns the results dict."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    cfg.validate()
    paths = report.output_paths(cfg.output)
    # probe only: the directories are created once every input below has been validated
    check_writable(paths["json"], flag="--output", create=False)
    if cfg.save_prompts:
        check_writable(cfg.save_prompts, flag="--save-prompts", create=False)
    meta = model_meta(cfg.hf_dir)
    mpe = meta["max_position_embeddings"]
    over = [n for n in cfg.lengths if mpe and n > MAX_LENGTH_FACTOR * mpe]
    if over:
        raise UserError(f"--lengths {','.join(map(str, over))}: more than {MAX_LENGTH_FACTOR}x "
                        f"the model's max_position_embeddings ({mpe}, so at most "
                        f"{MAX_LENGTH_FACTOR * mpe}); give lengths up to that")

    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    tokenizer = runner.load_tokenizer(cfg.hf_dir)
    chat.check_setting(cfg.chat_template, cfg.hf_dir, tokenizer, log)
    text_tokens = TextTokens(tokenizer)
    gen_tasks = [t for t in cfg.tasks if t != "ppl"]
    haystack = None
    if any(t in ESSAY_TASKS for t in gen_tasks):
        haystack = ruler_sources.load_haystack(cfg.haystack)
    if any(t in SYNTHETIC_TASKS for t in gen_tasks):
        ruler_sources.wonder_words()  # fail early when the word lists are missing
    docs = texts = None
    if "ppl" in cfg.tasks:
        texts = perplexity.load_documents(cfg.ppl_data or "", key=cfg.ppl_key)
        docs = perplexity.tokenize_documents(tokenizer, texts,
                                             max_tokens=cfg.ppl_doc_tokens or None)
        longest = max(len(d) for d in docs)
        if cfg.ppl_protocol == "document" and longest < min(cfg.lengths):
            raise UserError(f"--ppl-data {cfg.ppl_data}: the longest document has {longest} "
                            f"tokens, fewer than the shortest length ({min(cfg.lengths)}); "
                            "give longer documents")
    _check_lengths(cfg, gen_tasks, text_tokens, haystack)
    bench_stage.check_files(cfg, gen_tasks)
    long = [n for n in cfg.lengths if mpe and n > mpe]
    if long:
        log(f"warning: --lengths {','.join(map(str, long))} exceed the model's "
            f"max_position_embeddings ({mpe}); evaluating anyway")
    legacy: dict[str, Any] = {}
    if any(t in LEGACY_TASKS for t in gen_tasks):
        legacy = {"tokens": old.PromptTokens(tokenizer), "fillers": {}}

    import torch
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
        "chat_template": cfg.chat_template,
        "tokenizer_chat_template": bool(getattr(tokenizer, "chat_template", None)), **meta}}
    if haystack is not None:
        results["meta"]["haystack"] = {"source": haystack.source,
                                       "substitute": haystack.substitute}
    prompts_file = open(cfg.save_prompts, "w", encoding="utf-8") if cfg.save_prompts else None
    records: list[dict[str, Any]] = []
    try:
        with tqdm(disable=not cfg.progress, desc="eval", unit="prompt", file=sys.stderr,
                  dynamic_ncols=True) as bar:
            for task in gen_tasks:
                for length in cfg.lengths:
                    bar.set_description(f"{task}@{length} prompts")
                    samples = _prompts(task, length, cfg, text_tokens, legacy, haystack)
                    bar.total = (bar.total or 0) + len(samples)
                    bar.set_description(f"{task}@{length}")
                    recs = runner.run_generation(model, tokenizer, samples,
                                                 batch_size=cfg.batch_size, progress=bar)
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


def replace(cfg: EvalConfig, **changes: Any) -> EvalConfig:
    """A copy of ``cfg`` with ``changes`` (keyword-only dataclass helper)."""
    return dataclasses.replace(cfg, **changes)
