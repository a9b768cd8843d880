"""JSONL -> Megatron ``PREFIX.bin/.idx`` (the tokenized documents) + EndPrompt sidecar.

Pipeline: tokenize, then build the sidecar on the same code as for any existing corpus
(:mod:`~megatron_endprompt.data.prepare.build_sidecar`). Documents are read in order (a partition of
the inputs with ``--partitions/--partition-index``), tokenized by
:mod:`~megatron_endprompt.data.tokenize.encode` (Rust batches for HF fast tokenizers, else a worker
pool) and streamed one document per sequence into
:class:`~megatron_endprompt.data.sidecar.indexed_io.IndexedWriter` — byte for byte the ``.bin/.idx``
Megatron-LM's ``tools/preprocess_data.py`` writes through ``IndexedDatasetBuilder`` — so one
tokenization serves every layout. With a local HF ``tokenizer.json`` the Rust pipeline starts
before torch/Megatron-Core are imported (:mod:`~megatron_endprompt.data.tokenize.early_encode`), its
work kept only if that file is exactly Megatron's tokenizer. Outputs go to temporary names,
committed all-or-nothing under an exclusive prefix lock
(:mod:`~megatron_endprompt.data.prepare.atomic_output`).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from megatron_endprompt.data.prepare.atomic_output import (PrefixWriter, check_output_prefix,
                                                           check_targets)
from megatron_endprompt.data.prepare.build_sidecar import (NoSampleError, SidecarOptions,
                                                           build_sidecar)
from megatron_endprompt.data.tokenize.early_encode import EarlyEncoding, tokenizer_json
from megatron_endprompt.data.tokenize.encode import fast_encoded, first_texts, pool_encoded
from megatron_endprompt.data.sidecar.indexed_io import IndexedWriter, optimal_dtype
from megatron_endprompt.data.prepare.prefix_guard import (check_inputs_not_written,
                                                         check_other_sidecars,
                                                         check_sidecar_target, run_id)
from megatron_endprompt.data.prepare.progress import Progress
from megatron_endprompt.data.prepare.prompts import load_prompts, tokenize_prompts
from megatron_endprompt.data.tokenize.read_input import expand_inputs, input_range, read_lines
from megatron_endprompt.data.sidecar.sidecar import check_sidecar_name, open_sidecar, sidecar_path
from megatron_endprompt.data.sidecar.terminal_spec import TerminalSpec
from megatron_endprompt.data.tokenize.encoder_choice import BACKENDS, choose_encoder
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec
from megatron_endprompt.data.tokenize.tokenizer_verdict import preprocessing_tokenizer
from megatron_endprompt import runtime
from megatron_endprompt.errors import UserError
from megatron_endprompt.layout import LayoutConfig


@dataclass(kw_only=True)
class PreprocessOptions:
    """Everything ``tools/preprocess_endprompt.py`` accepts (flag names in comments)."""

    inputs: list[str]
    """``--input``: JSONL files or glob patterns."""
    output_prefix: str
    """``--output-prefix``: writes ``PREFIX.bin``, ``PREFIX.idx`` and ``PREFIX.endprompt``
    (``PREFIX_partI_of_N.*`` for a partition)."""
    tokenizer: TokenizerSpec
    """``--tokenizer-type`` / ``--tokenizer-model`` / ``--vocab-size``."""
    layout: LayoutConfig
    """``--seq-length``, ``--target-length``, ``--placement``, ``--pose-chunks``, weights."""
    terminal: TerminalSpec
    """``--terminal-source/-length/-prompts/-loss-weight``, ``--seed`` (per-sample layouts come
    from ``(seed, partition, sample index)``)."""
    json_keys: list[str] = field(default_factory=lambda: ["text"])
    """``--json-keys``: text fields; several keys are joined with a newline into one document."""
    append_eod: bool = False
    """``--append-eod``: end every document with the tokenizer's EOD token."""
    workers: int = 1
    """``--workers``: tokenizer processes (Rust threads for an HF fast tokenizer)."""
    partitions: int = 1
    """``--partitions N``: the inputs are cut into N line-aligned byte ranges."""
    partition_index: int = 0
    """``--partition-index I``: the range this process tokenizes."""
    log_interval: int = 1000
    """``--log-interval``: documents between progress lines when stderr is not a terminal."""
    progress: bool = True
    """Show a tqdm bar (bytes done of the total, ETA) on a terminal."""
    tokenizer_backend: str = "auto"
    """``--tokenizer-backend``: auto | hf | tiktoken (see ``encoder_choice.BACKENDS``)."""
    name: str | None = None
    """``--name``: write the sidecar as ``PREFIX.NAME.endprompt`` (default ``PREFIX.endprompt``)."""

    def __post_init__(self) -> None:
        # fail before the tokenizer and workers start (prompts are checked once tokenized)
        self.terminal.check(self.layout)
        if self.tokenizer_backend not in BACKENDS:
            raise ValueError(f"--tokenizer-backend must be one of {', '.join(BACKENDS)}")
        if self.workers < 1:
            raise ValueError(f"--workers {self.workers} must be >= 1")
        if not self.json_keys:
            raise ValueError("--json-keys needs at least one key")
        if self.partitions < 1:
            raise ValueError(f"--partitions {self.partitions} must be >= 1 (1: one process "
                             "tokenizes everything; N: N processes, then merge)")
        if not 0 <= self.partition_index < self.partitions:
            raise ValueError(f"--partition-index {self.partition_index} must be in "
                             f"0..{self.partitions - 1} (--partitions {self.partitions})")
        if self.log_interval < 1:
            raise ValueError(f"--log-interval {self.log_interval} must be >= 1")
        check_output_prefix(self.output_prefix)
        check_sidecar_name(self.name)

    def sidecar_options(self) -> SidecarOptions:
        """The sidecar build of :attr:`prefix` (no progress bar of its own)."""
        return SidecarOptions(data_prefix=self.prefix, layout=self.layout, terminal=self.terminal,
                              tokenizer=self.tokenizer, name=self.name, progress=False,
                              partition=(self.partition_index, self.partitions))

    @property
    def prefix(self) -> str:
        """The prefix actually written (``PREFIX_partI_of_N`` for a partition)."""
        if self.partitions == 1:
            return self.output_prefix
        return f"{self.output_prefix}_part{self.partition_index}_of_{self.partitions}"


def preprocess(opts: PreprocessOptions) -> dict:
    """Run the pipeline; returns the summary (also stored in the sidecar header)."""
    paths = expand_inputs(opts.inputs)
    sidecar = sidecar_path(opts.prefix, opts.name)
    check_targets(opts.prefix, sidecar)  # a directory in the way fails now, not at the commit
    check_inputs_not_written(paths, opts.prefix, sidecar)
    runtime.tokenizer_env(threads=opts.workers)  # encode_batch's pool: --workers threads
    span = input_range(paths, opts.partition_index, opts.partitions)
    check_sidecar_target(opts.prefix, opts.name)
    started = time.perf_counter()  # rates and ETA count from here: tokenizing starts now
    early = _start_early(opts, span)  # tokenizes while torch/Megatron import below
    try:
        return _preprocess(opts, span, early, started, paths)
    finally:
        if early is not None:
            early.cancel()


def _start_early(opts: PreprocessOptions, span) -> EarlyEncoding | None:
    path = tokenizer_json(opts.tokenizer)
    if path is None:
        return None
    try:
        return EarlyEncoding(path, read_lines(span), json_keys=opts.json_keys,
                             append_eod=opts.append_eod, spec=opts.tokenizer,
                             use_tiktoken=opts.tokenizer_backend != "hf", workers=opts.workers)
    except Exception:  # a file transformers reads but tokenizers cannot: Megatron's path decides
        return None


def _preprocess(opts: PreprocessOptions, span, early: EarlyEncoding | None,
                started: float, paths: list[str]) -> dict:
    # fail fast, before any worker starts; Megatron's tokenizer unless a cached verdict says
    # tokenizer.json alone is it (tokenizer_verdict)
    tokenizer, tokenizer_note = preprocessing_tokenizer(
        opts.tokenizer, backend=None if early is None else early.backend)
    sidecar_opts = opts.sidecar_options()
    if opts.terminal.is_prompt:  # refuse prompts that do not fit before tokenizing
        for ids in tokenize_prompts(load_prompts(opts.terminal.prompts), tokenizer):
            try:
                opts.layout.check_terminal_length(len(ids))
            except ValueError as exc:
                raise UserError(str(exc)) from None
    # lock, stale temporaries, crash-safe commit
    writer = PrefixWriter(opts.prefix, sidecar=sidecar_path(opts.prefix, opts.name))
    tmp = writer.tmp
    skipped: Counter[str] = Counter()
    t0 = time.perf_counter()
    builder = encoder = None
    try:
        builder = IndexedWriter(tmp[".bin"], optimal_dtype(tokenizer.vocab_size))
        encoder, path, why = choose_encoder(
            tokenizer, first_texts(read_lines(span), opts.json_keys), append_eod=opts.append_eod,
            workers=opts.workers, backend=opts.tokenizer_backend)
        # the sidecar header records the path and why (what decides the ids); how the tokenizer
        # was loaded (cold run, cached verdict and its date) is the summary's tokenizer_note
        # only, so the same input gives the same sidecar bytes whatever the cache holds
        recorded_why = why
        why = f"{why}; {tokenizer_note}" if tokenizer_note else why
        if opts.tokenizer_backend == "tiktoken" and path != "tiktoken":
            raise UserError(f"--tokenizer-backend tiktoken: cannot be used for "
                            f"{opts.tokenizer.tokenizer_model} ({why}); use "
                            "--tokenizer-backend auto")
        if opts.progress:  # early, for a long run; the summary always has it (format_summary)
            print(f"tokenizer path: {_PATH_NAMES[path]} ({why})", file=sys.stderr, flush=True)
        docs = None if early is None else early.adopt(
            encoder, vocab=tokenizer.vocab_size, eod=tokenizer.eod if opts.append_eod else None)
        ran = encoder if docs is None else early.encoder  # whose slow_docs count this run
        if docs is None and encoder is not None:
            docs = fast_encoded(read_lines(span), encoder, json_keys=opts.json_keys,
                                vocab=tokenizer.vocab_size, spec=opts.tokenizer)
        elif docs is None:
            if early is not None:  # its rayon pool ran: tokenizers would warn in forked workers
                runtime.tokenizer_env(threads=opts.workers, forked_workers=True)
            docs = pool_encoded(read_lines(span), spec=opts.tokenizer, json_keys=opts.json_keys,
                                append_eod=opts.append_eod, workers=opts.workers)
        progress = Progress(span.total_bytes, enabled=opts.progress, started=started,
                            every_items=opts.log_interval)
        n_docs = n_tokens = 0
        for status, ids, nbytes in docs:
            if ids is None:
                skipped[status] += 1
            else:
                builder.add_document(ids, [len(ids)])
                n_docs += 1
                n_tokens += len(ids)
            progress.update(nbytes, tokens=n_tokens)
        progress.close()
        read = {"documents_read": n_docs + sum(skipped.values()),
                "documents_skipped": dict(skipped),
                "tokenizer_path": path, "tokenizer_path_reason": recorded_why}
        if getattr(ran, "missing_bytes", ()):
            read["documents_on_hf_path"] = ran.slow_docs
        if opts.partitions > 1:  # what a merge checks: every shard of this one run
            read["run_id"] = run_id(
                base_seed=opts.terminal.seed, layout=opts.layout.to_header(),
                terminal_source=opts.terminal.source, terminal_length=opts.terminal.length,
                count=opts.partitions, inputs=paths)
        if n_docs == 0:
            _no_sample(opts, 0, 0)
        builder.finalize(tmp[".idx"])
        try:
            summary = build_sidecar(sidecar_opts, bin_path=tmp[".bin"], idx_path=tmp[".idx"],
                                    out_path=tmp[".endprompt"], tokenizer=tokenizer,
                                    extra_stats=read)
        except NoSampleError:
            _no_sample(opts, n_docs, n_tokens)
        summary["seconds"] = round(time.perf_counter() - t0, 3)
        if tokenizer_note:
            summary["tokenizer_note"] = tokenizer_note
        check_other_sidecars(opts.prefix, sidecar_path(opts.prefix, opts.name),
                             open_sidecar(tmp[".endprompt"]).header.idx_sha256)
        writer.commit()
    finally:
        if builder is not None:
            builder.close()  # idempotent; an aborted run's .bin is closed before removal
        if encoder is not None and hasattr(encoder, "close"):
            encoder.close()  # the tiktoken encoder's threads
        writer.close()
    return summary


_PATH_NAMES = {"tiktoken": "tiktoken", "rust-batch": "HF tokenizers (Rust batches)",
               "spm-batch": "SentencePiece (C++ batches)",
               "per-document": "Megatron's tokenizer per document (worker pool)"}


def _no_sample(opts: PreprocessOptions, docs: int, tokens: int) -> None:
    part = (f" in partition {opts.partition_index} of {opts.partitions}"
            if opts.partitions > 1 else "")
    raise UserError(
        f"--input: no sample could be built{part} ({docs} documents, {tokens} tokens; one "
        f"sample needs {opts.layout.seq_length + 1}); add data or lower --seq-length")


def format_summary(summary: dict) -> str:
    """Human-readable summary lines."""
    lines = [
        f"documents read: {summary['documents_read']:,}  used: {summary['documents_used']:,}"
        + (f"  (tokenized: {summary['tokenizer_path']})" if "tokenizer_path" in summary else ""),
    ]
    if "tokenizer_path" in summary:  # with --no-progress too: which path ran and why
        slow = summary.get("documents_on_hf_path")
        note = summary.get("tokenizer_note")
        lines.append(f"tokenizer path: {_PATH_NAMES[summary['tokenizer_path']]} "
                     f"({summary['tokenizer_path_reason']}"
                     + (f"; {note})" if note else ")")
                     + ("" if slow is None else f"; {slow:,} of {summary['documents_read']:,} "
                        "documents held a byte the vocabulary lacks and took the HF "
                        "tokenizers path"))
    for reason, n in summary["documents_skipped"].items():
        lines.append(f"  skipped ({reason}): {n:,}")
    lines += [
        f"documents shorter than one sample: {summary['documents_shorter_than_sample']:,} "
        f"({summary['short_documents_handling']})",
        f"samples: {summary['samples_written']:,}  tokens in samples: "
        f"{summary['tokens_in_samples']:,} (of {summary['tokens_in']:,} tokenized)",
    ]
    if "pose" in summary:
        pose = summary["pose"]
        lines.append(f"PoSE ({pose['law']}): documents dropped: {summary['documents_dropped']:,}; "
                     f"tokens outside the chunks (text skips, tails): "
                     f"{summary['tokens_unused_middle']:,}; mean text skip "
                     f"{pose['text_skip_mean']:.1f}, mean position skip "
                     f"{pose['position_skip_mean']:.1f}")
    elif summary["tokens_unused_middle"]:
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
    if "ep2" in summary:
        lines.append(f"  EP2 <eot> is {summary['ep2']}")
    return "\n".join(lines)
