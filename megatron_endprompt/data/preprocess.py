"""JSONL -> Megatron ``PREFIX.bin/.idx`` + EndPrompt sidecar ``PREFIX.endprompt``.

Pipeline: the main process streams raw lines (bytes, with file and line number) in batches to
a pool of workers; each worker builds its tokenizer once, decodes UTF-8, parses JSON and
tokenizes; the main process cuts the ordered token stream into samples
(:class:`~megatron_endprompt.data.samples.SampleMaker`) and writes them with Megatron's
``IndexedDatasetBuilder``. Outputs go to temporary names, committed all-or-nothing under an
exclusive prefix lock (:mod:`~megatron_endprompt.data.atomic_output`).
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import numpy as np

from megatron_endprompt.data.atomic_output import PrefixWriter, check_output_prefix
from megatron_endprompt.data.prompts import load_prompts, tokenize_prompts
from megatron_endprompt.data.samples import SampleMaker, TERMINAL_SOURCES
from megatron_endprompt.data.sidecar import (
    SidecarHeader,
    check_sidecar_name,
    file_fingerprint,
    sidecar_path,
    write_sidecar,
)
from megatron_endprompt.data.tokenizer import TokenizerSpec, build_tokenizer
from megatron_endprompt.data.tokenizer_identity import tokenizer_identity
from megatron_endprompt.errors import UserError
from megatron_endprompt.layout import LayoutConfig

_BATCH_LINES = 128
# A batch also ends at this many bytes: long documents make small batches, so the pool gets
# enough tasks to keep every worker busy to the end (load balance, first results sooner).
_BATCH_BYTES = 1 << 16


@dataclass(kw_only=True)
class PreprocessOptions:
    """Everything ``tools/preprocess_endprompt.py`` accepts (flag names in comments)."""

    inputs: list[str]
    """``--input``: JSONL files or glob patterns."""
    output_prefix: str
    """``--output-prefix``: writes ``PREFIX.bin``, ``PREFIX.idx`` and ``PREFIX.endprompt``."""
    tokenizer: TokenizerSpec
    """``--tokenizer-type`` / ``--tokenizer-model`` / ``--vocab-size``."""
    layout: LayoutConfig
    """``--seq-length``, ``--target-length``, ``--placement``, ``--pose-chunks``, weights."""
    terminal_source: str = "continuation"
    """``--terminal-source``: continuation | document-tail | prompt."""
    terminal_length: int | None = None
    """``--terminal-length``: ``b`` (not used with prompts)."""
    terminal_prompts: str | None = None
    """``--terminal-prompts``: a file with one prompt per line (default: the built-in set)."""
    json_keys: list[str] = field(default_factory=lambda: ["text"])
    """``--json-keys``: text fields; several keys are joined with a newline into one document."""
    append_eod: bool = False
    """``--append-eod``: end every document with the tokenizer's EOD token."""
    workers: int = 1
    """``--workers``: tokenizer processes."""
    seed: int = 1234
    """``--seed``: per-sample layouts come from ``(seed, sample index)``."""
    progress: bool = True
    """Show a tqdm bar (docs/s, tokens/s) on a terminal."""
    name: str | None = None
    """``--name``: write the sidecar as ``PREFIX.NAME.endprompt`` (default ``PREFIX.endprompt``)."""

    def __post_init__(self) -> None:
        if self.terminal_source not in TERMINAL_SOURCES:
            raise ValueError(f"--terminal-source must be one of {', '.join(TERMINAL_SOURCES)}")
        if self.terminal_source != "prompt":
            if self.terminal_length is None:
                raise ValueError(f"--terminal-source {self.terminal_source} needs "
                                 "--terminal-length")
            # fail before the tokenizer and workers start (prompts are checked once tokenized)
            self.layout.check_terminal_length(self.terminal_length)
        if self.workers < 1:
            raise ValueError(f"--workers {self.workers} must be >= 1")
        if not self.json_keys:
            raise ValueError("--json-keys needs at least one key")
        if not 0 <= self.seed < 2**63:  # numpy seeds are non-negative; fail before tokenizing
            raise ValueError(f"--seed {self.seed} must be in [0, 2**63)")
        check_output_prefix(self.output_prefix)
        check_sidecar_name(self.name)


# -- worker side ---------------------------------------------------------------------------
_WORKER: dict = {}


def _init_worker(spec: TokenizerSpec, json_keys: list[str], append_eod: bool) -> None:
    """Build the tokenizer once per worker process."""
    tok = build_tokenizer(spec)
    _WORKER.update(tok=tok, keys=json_keys, eod=tok.eod if append_eod else None,
                   vocab=tok.vocab_size, spec=spec)


def _encode_line(path: str, lineno: int, raw: bytes) -> tuple[str, np.ndarray | None]:
    """``("ok", tokens)`` or ``(skip_reason, None)``; bad input raises :class:`UserError`."""
    where = f"{path}:{lineno}"
    if not raw.strip():
        return "blank line", None
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{where}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
            "re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8"
        ) from None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        msg = exc.msg.removesuffix(" at")
        raise UserError(f"{where}: malformed JSON ({msg}, column {exc.colno}); "
                        "fix or remove the line") from None
    if not isinstance(obj, dict):
        raise UserError(f"{where}: a JSON object is expected, got {type(obj).__name__}")
    parts = []
    for key in _WORKER["keys"]:
        if key not in obj:
            raise UserError(f"{where}: no key {key!r} (keys: {', '.join(map(str, obj)) or 'none'}); "
                            "pass the right --json-keys")
        if not isinstance(obj[key], str):
            raise UserError(f"{where}: key {key!r} is {type(obj[key]).__name__}, not a string")
        parts.append(obj[key])
    text = "\n".join(parts)
    if not text.strip():
        return "empty or whitespace-only text", None
    eod = _WORKER["eod"]
    try:
        ids = _WORKER["tok"].tokenize(text)
        # One pass from the Python ints to int64, EOD included (no np.append copy).
        ids = np.fromiter(ids if eod is None else itertools.chain(ids, (eod,)),
                          dtype=np.int64, count=len(ids) + (eod is not None))
    except Exception as exc:  # e.g. NullTokenizer on text that is not whitespace-separated ints
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as enc:  # tokenizers fail cryptically on these
            raise UserError(
                f"{where}: lone surrogate {text[enc.start].encode('unicode_escape').decode()} at "
                f"character {enc.start + 1} of the text (half of a UTF-16 pair, e.g. a JSON "
                "\\ud800 escape); fix the producer or drop the line") from None
        spec = _WORKER["spec"]
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UserError(f"{where}: --tokenizer-type {spec.tokenizer_type} cannot tokenize this "
                        f"text ({first}); use the matching tokenizer or fix the line") from None
    if len(ids) == 0:
        return "no tokens after tokenization", None
    if int(ids.min()) < 0:  # would wrap around silently in the unsigned .bin dtype
        raise UserError(f"{where}: negative token id {int(ids.min())} from --tokenizer-type "
                        f"{_WORKER['spec'].tokenizer_type}; token ids must be >= 0")
    vocab = _WORKER["vocab"]
    if vocab is not None and int(ids.max()) >= vocab:
        spec = _WORKER["spec"]
        raise UserError(
            f"{where}: token id {int(ids.max())} >= vocab size {vocab} of --tokenizer-type "
            f"{' '.join(filter(None, [spec.tokenizer_type, spec.tokenizer_model]))}; "
            "use the matching tokenizer"
            + (" or a larger --vocab-size" if spec.tokenizer_type == "NullTokenizer" else "")
        )
    return "ok", ids


def _encode_batch(batch: list[tuple[str, int, bytes]]) -> list[tuple[str, np.ndarray | None]]:
    return [_encode_line(*item) for item in batch]


# -- main process ----------------------------------------------------------------------
def expand_inputs(patterns: list[str]) -> list[str]:
    """Files named by ``--input`` (globs allowed), sorted per pattern, each checked readable."""
    paths: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise UserError(f"--input {pattern}: matches no file")
        for p in matches:
            if not os.path.isfile(p) or not os.access(p, os.R_OK):
                raise UserError(f"--input {p}: not a readable file")
        paths.extend(matches)
    return paths


def _batches(paths: list[str]) -> Iterator[list[tuple[str, int, bytes]]]:
    batch = []
    size = 0
    for path in paths:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                batch.append((path, lineno, raw))
                size += len(raw)
                if len(batch) == _BATCH_LINES or size >= _BATCH_BYTES:
                    yield batch
                    batch, size = [], 0
    if batch:
        yield batch


def _encoded(opts: PreprocessOptions, paths: list[str]) -> Iterator[tuple[str, np.ndarray | None]]:
    """Encoded documents in input order, from a worker pool or inline."""
    init = (opts.tokenizer, opts.json_keys, opts.append_eod)
    if opts.workers == 1:
        _init_worker(*init)
        for batch in _batches(paths):
            yield from _encode_batch(batch)
        return
    import multiprocessing
    import warnings

    # fork, as Megatron-LM's preprocess_data does: workers start in milliseconds instead of
    # re-importing torch + Megatron (~4 s each). Python 3.12 warns because torch's idle native
    # thread pools exist in this process; the workers only decode, parse and tokenize (no
    # torch ops, no OpenMP), so no lock held by those threads is ever needed in a child.
    ctx = multiprocessing.get_context("fork")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*multi-threaded, use of fork.*",
                                category=DeprecationWarning)
        pool = ctx.Pool(opts.workers, initializer=_init_worker, initargs=init)
    with pool:
        for results in pool.imap(_encode_batch, _batches(paths)):
            yield from results


def preprocess(opts: PreprocessOptions) -> dict:
    """Run the pipeline; returns the summary (also stored in the sidecar header)."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    from tqdm import tqdm

    paths = expand_inputs(opts.inputs)
    tokenizer = build_tokenizer(opts.tokenizer)  # fail fast, before any worker starts
    prompt_texts = load_prompts(opts.terminal_prompts) if opts.terminal_source == "prompt" else []
    try:
        maker = SampleMaker(
            opts.layout,
            terminal_source=opts.terminal_source,
            terminal_length=None if opts.terminal_source == "prompt" else opts.terminal_length,
            prompts=tokenize_prompts(prompt_texts, tokenizer) if prompt_texts else None,
            eod=tokenizer.eod,
            seed=opts.seed,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    # lock, stale temporaries, crash-safe commit
    writer = PrefixWriter(opts.output_prefix, sidecar=sidecar_path(opts.output_prefix, opts.name))
    tmp = writer.tmp
    skipped: Counter[str] = Counter()
    records: list[np.ndarray] = []
    t0 = time.perf_counter()
    try:
        builder = IndexedDatasetBuilder(tmp[".bin"], dtype=DType.optimal_dtype(tokenizer.vocab_size))
        bar = tqdm(unit="docs", disable=None if opts.progress else True, smoothing=0.1)
        for status, ids in _encoded(opts, paths):
            bar.update(1)
            if ids is None:
                skipped[status] += 1
                continue
            for sample, record in maker.add_document(ids):
                builder.add_document(sample, [len(sample)])
                records.append(record)
            if bar.n % 256 == 0 and not bar.disable:
                elapsed = max(time.perf_counter() - t0, 1e-9)
                bar.set_postfix_str(f"{maker.stats.tokens_in / elapsed:,.0f} tokens/s")
        bar.close()
        maker.finish()
        stats = maker.stats
        if stats.samples == 0:
            raise UserError(
                f"--input: no sample could be built ({stats.docs} documents, {stats.tokens_in} "
                f"tokens; one sample needs {opts.layout.seq_length + 1}); add data or lower "
                "--seq-length"
            )
        builder.finalize(tmp[".idx"])
        summary = {
            "documents_read": stats.docs + sum(skipped.values()),
            "documents_used": stats.docs,
            "documents_skipped": dict(skipped),
            "documents_shorter_than_sample": stats.docs_shorter_than_sample,
            "short_documents_handling": "packed with neighbouring documents",
            "samples_written": stats.samples,
            "tokens_in": stats.tokens_in,
            "tokens_written": stats.samples * (opts.layout.seq_length + 1),
            "tokens_unused_middle": stats.tokens_unused_middle,
            "samples_contiguous_positions": stats.samples_contiguous,
            "tokens_left_over_at_end": stats.tokens_left_over,
            "prompt_counts": dict(zip(prompt_texts, stats.prompt_counts)),
            "prompt_ids": {p: ids.tolist() for p, ids in zip(prompt_texts, maker.prompts)},
            "seconds": round(time.perf_counter() - t0, 3),
        }
        header = SidecarHeader(
            layout=asdict(opts.layout),
            terminal_source=opts.terminal_source,
            terminal_length=None if opts.terminal_source == "prompt" else opts.terminal_length,
            prompts=prompt_texts,
            seed=opts.seed,
            num_samples=stats.samples,
            idx_sha256=file_fingerprint(tmp[".idx"]),
            idx_bytes=os.path.getsize(tmp[".idx"]),
            bin_bytes=os.path.getsize(tmp[".bin"]),
            tokenizer=tokenizer_identity(
                tokenizer, tokenizer_type=opts.tokenizer.tokenizer_type,
                tokenizer_model=_abs_model(opts.tokenizer).get(
                    "tokenizer_model", opts.tokenizer.tokenizer_model)),
            # no wall-clock time in the file: same inputs and seed give byte-identical outputs
            stats={k: v for k, v in summary.items() if k != "seconds"},
        )
        write_sidecar(tmp[".endprompt"], header, np.stack(records))
        writer.commit()
    finally:
        writer.close()
    return summary


def _abs_model(spec: TokenizerSpec) -> dict:
    """Record an existing tokenizer path as absolute, so ``inspect`` finds it from anywhere."""
    path = spec.tokenizer_model
    return {"tokenizer_model": os.path.abspath(path)} if path and os.path.exists(path) else {}


def format_summary(summary: dict) -> str:
    """Human-readable summary lines."""
    lines = [
        f"documents read: {summary['documents_read']:,}  used: {summary['documents_used']:,}",
    ]
    for reason, n in summary["documents_skipped"].items():
        lines.append(f"  skipped ({reason}): {n:,}")
    lines += [
        f"documents shorter than one sample: {summary['documents_shorter_than_sample']:,} "
        f"({summary['short_documents_handling']})",
        f"samples written: {summary['samples_written']:,}  tokens written: "
        f"{summary['tokens_written']:,} (of {summary['tokens_in']:,} tokenized)",
    ]
    if summary["tokens_unused_middle"]:
        lines.append(f"tokens between context and document tail (unused by design): "
                     f"{summary['tokens_unused_middle']:,}")
    if summary.get("samples_contiguous_positions"):
        lines.append(f"samples from documents shorter than one sample (contiguous positions): "
                     f"{summary['samples_contiguous_positions']:,}")
    lines.append(f"tokens left at the end of the stream (less than one sample): "
                 f"{summary['tokens_left_over_at_end']:,}")
    for prompt, n in summary["prompt_counts"].items():
        ids = summary.get("prompt_ids", {}).get(prompt, [])
        lines.append(f"  prompt {prompt!r}: {n:,} samples (token ids {ids})")
    return "\n".join(lines)
