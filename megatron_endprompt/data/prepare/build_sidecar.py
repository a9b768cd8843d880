"""An EndPrompt sidecar for an existing Megatron corpus, without touching its ``.bin/.idx``.

Why: re-tokenizing a corpus for every layout (L = 32K/64K/128K, fixed or random, several
``b``) costs hours; the layout needs only token *positions*. The documents come from the
``.idx`` (Megatron's document boundaries), the sample cutting is exactly
:class:`~megatron_endprompt.data.prepare.samples.SampleMaker`'s (continuation / document-tail /
prompt), and each sample is stored as a span row (see :mod:`.spans`) next to its layout record.

How the cutting is reused without copying tokens: the maker is fed, per document, the *stream
offsets* of its tokens (``arange(start, end)``) instead of the tokens, and prompts as negative
markers; the "sample" it emits is then the list of offsets it would have copied, from which the
span row is read off. Same code, same per-sample draws ``sample_rng(seed, i)``, same
``document-tail`` semantics (context and tail of one document; documents shorter than one sample
packed into windows with contiguous positions, counted).

Writing: standalone, the sidecar goes to a temporary name and is renamed into place under the
prefix lock (:func:`~megatron_endprompt.data.prepare.atomic_output.prefix_lock`), so it never meets
a concurrent preprocessing of the same prefix and a crash leaves the previous sidecar; inside
preprocessing it is one of :class:`~megatron_endprompt.data.prepare.atomic_output.PrefixWriter`'s
temporaries. The tokenizer identity is recorded when a tokenizer is given, else none (the trainer
then warns that it cannot check it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from megatron_endprompt.data.prepare.atomic_output import (check_output_prefix, check_targets,
                                                           finish_interrupted_commit, prefix_lock)
from megatron_endprompt.data.sidecar.bin_checksum import bin_block_crcs
from megatron_endprompt.data.sidecar.indexed_io import IndexReader
from megatron_endprompt.data.prepare.prefix_guard import check_sidecar_target
from megatron_endprompt.data.prepare.progress import Progress
from megatron_endprompt.data.prepare.prompts import (EOT_PROMPT, ep2_note, load_prompts,
                                                     tokenize_prompts)
from megatron_endprompt.data.prepare.samples import SampleMaker
from megatron_endprompt.data.sidecar.sidecar import (
    SidecarHeader,
    check_sidecar_name,
    file_fingerprint,
    sidecar_path,
    write_sidecar,
)
from megatron_endprompt.data.sidecar.spans import (EOD_PIECE, pack_sources, pieces_of,
                                                   token_stream_bounds)
from megatron_endprompt.data.sidecar.terminal_spec import TerminalSpec
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer
from megatron_endprompt.data.tokenize.tokenizer_identity import tokenizer_identity
from megatron_endprompt.disk import atomic_path, remove_stale_temporaries
from megatron_endprompt.errors import UserError, user_errors
from megatron_endprompt.layout import LayoutConfig
from megatron_endprompt import pose_law


class NoSampleError(UserError):
    """No sample could be built: the corpus is shorter than one sample (preprocessing
    re-words it for its ``--input``)."""


def partition_seed(seed: int, index: int, count: int) -> int:
    """Seed of partition ``index`` of ``count``: draws depend on ``(seed, partition, sample)``,
    so shards never repeat each other's layouts; one partition keeps ``seed`` itself."""
    if count == 1:
        return seed
    state = np.random.SeedSequence([seed, index, count]).generate_state(2, np.uint32)
    return (int(state[0]) & 0x7FFFFFFF) << 32 | int(state[1])  # a valid header seed (< 2**63)


@dataclass(frozen=True, kw_only=True)
class SidecarOptions:
    """Everything ``tools/build_endprompt_sidecar.py`` accepts (flag names in comments)."""

    data_prefix: str
    """``--data-prefix``: an existing ``PREFIX.bin/.idx``."""
    layout: LayoutConfig
    """``--seq-length``, ``--target-length``, ``--placement``, ``--pose-chunks``, weights."""
    terminal: TerminalSpec
    """``--terminal-source/-length/-prompts/-loss-weight``, ``--seed``."""
    tokenizer: TokenizerSpec | None = None
    """``--tokenizer-type/--tokenizer-model``: needed for prompts (tokens, EOD); recorded."""
    name: str | None = None
    """``--name``: writes ``PREFIX.NAME.endprompt``."""
    partition: tuple[int, int] = (0, 1)
    """``(index, count)`` of a sharded run: the draws use :func:`partition_seed`."""
    progress: bool = True
    """A tqdm bar over documents on a terminal, else periodic progress lines (a log file)."""

    def __post_init__(self) -> None:
        if self.terminal.is_prompt and self.tokenizer is None:
            raise ValueError("--terminal-source prompt needs --tokenizer-type (and "
                             "--tokenizer-model) to tokenize the prompts")
        self.terminal.check(self.layout)
        check_sidecar_name(self.name)


class _Rows:
    """Growable int rows (amortised doubling; no per-sample Python objects kept)."""

    def __init__(self, width: int, dtype) -> None:
        self.data = np.empty((1024, width), dtype=dtype)
        self.n = 0

    def append(self, row) -> None:
        if self.n == len(self.data):
            self.data = np.concatenate([self.data, np.empty_like(self.data)])
        self.data[self.n] = row
        self.n += 1

    def array(self) -> np.ndarray:
        return self.data[: self.n]


def build_sidecar(opts: SidecarOptions, *, bin_path: str | None = None,
                  idx_path: str | None = None, out_path: str | None = None,
                  tokenizer=None, extra_stats: dict | None = None) -> dict:
    """Write the sidecar of ``opts.data_prefix`` atomically; returns the summary.

    ``bin_path/idx_path/out_path`` override the file names (preprocessing builds the sidecar of
    its temporary files under its own prefix lock); ``tokenizer`` skips rebuilding an already
    built one. Standalone (no ``out_path``), the whole build holds ``PREFIX.lock``."""
    if out_path is not None:
        return _build(opts, bin_path, idx_path, out_path, tokenizer, extra_stats)
    check_output_prefix(opts.data_prefix, flag="--data-prefix")
    check_targets(opts.data_prefix, sidecar_path(opts.data_prefix, opts.name),
                  flag="--data-prefix", corpus=False)
    check_sidecar_target(opts.data_prefix, opts.name)
    with prefix_lock(opts.data_prefix, flag="--data-prefix"):
        finish_interrupted_commit(opts.data_prefix)
        return _build(opts, bin_path, idx_path, None, tokenizer, extra_stats)


def _build(opts: SidecarOptions, bin_path, idx_path, out_path, tokenizer, extra_stats) -> dict:
    prefix = opts.data_prefix
    bin_path = bin_path or prefix + ".bin"
    idx_path = idx_path or prefix + ".idx"
    for path in (bin_path, idx_path):
        if not os.path.isfile(path):
            raise UserError(f"--data-prefix {prefix}: {path} not found; give the prefix of an "
                            "existing Megatron .bin/.idx pair (without the suffix)")
    index = IndexReader(idx_path)  # numpy only: no torch/Megatron-Core import
    bin_bytes = os.path.getsize(bin_path)
    starts, ends = token_stream_bounds(index, prefix, bin_bytes)
    vocab_limit = np.iinfo(index.dtype).max + 1 if np.issubdtype(index.dtype, np.integer) else None

    if tokenizer is None and opts.tokenizer is not None:
        tokenizer = build_tokenizer(opts.tokenizer)
    term = opts.terminal
    prompt_texts = load_prompts(term.prompts) if term.is_prompt else []
    prompt_tokens = tokenize_prompts(prompt_texts, tokenizer) if prompt_texts else []
    for text, ids in zip(prompt_texts, prompt_tokens):
        if vocab_limit is not None and int(ids.max()) >= vocab_limit:
            raise UserError(f"--terminal-prompts: prompt {text!r} has token id {int(ids.max())}, "
                            f"beyond the {np.dtype(index.dtype).name} .bin of {prefix}; use the "
                            "corpus's own tokenizer")
    if tokenizer is not None and out_path is None:  # recorded, so it must be the corpus's
        # (inside preprocessing this tokenizer wrote the ids)
        null = opts.tokenizer is not None and opts.tokenizer.tokenizer_type == "NullTokenizer"
        _check_corpus_ids(bin_path, index.dtype, tokenizer.vocab_size, prefix,
                          prompts=bool(prompt_tokens),
                          flag="--vocab-size" if null else "--tokenizer-model")
    seed = partition_seed(term.seed, *opts.partition)
    markers = [np.full(len(p), -2 - k, dtype=np.int64) for k, p in enumerate(prompt_tokens)]
    with user_errors():
        maker = SampleMaker(opts.layout, terminal_source=term.source,
                            terminal_length=term.length, prompts=markers or None,
                            eod=EOD_PIECE, seed=seed)

    P = opts.layout.seq_length
    records = _Rows(opts.layout.record_width, np.int32)
    ptr = _Rows(1, np.int64)
    ptr.append(0)
    pieces = _Rows(2, np.int64)
    bar = Progress(len(starts), unit="documents", enabled=opts.progress)
    for start, end in zip(starts.tolist(), ends.tolist()):
        for offsets, record in maker.add_document(np.arange(start, end, dtype=np.int64)):
            for piece in pieces_of(offsets):
                pieces.append(piece)
            records.append(record)
            ptr.append(pieces.n)
        bar.update(1)
    bar.close()
    maker.finish()
    stats = maker.stats
    if stats.samples == 0:
        raise NoSampleError(f"--data-prefix {prefix}: no sample could be built ({stats.docs} "
                        f"documents, {stats.tokens_in} tokens; one sample needs {P + 1}); "
                        "add data or lower --seq-length")
    summary = {
        **(extra_stats or {}),
        "documents_used": stats.docs,
        "documents_shorter_than_sample": stats.docs_shorter_than_sample,
        "short_documents_handling": short_documents_handling(opts.layout, term.source),
        "samples_written": stats.samples,
        "tokens_in": stats.tokens_in,
        "tokens_in_samples": stats.samples * (P + 1),
        "tokens_unused_middle": stats.tokens_unused_middle,
        "samples_contiguous_positions": stats.samples_contiguous,
        "tokens_left_over_at_end": stats.tokens_left_over,
        "prompt_counts": dict(zip(prompt_texts, stats.prompt_counts)),
        "prompt_ids": {p: ids.tolist() for p, ids in zip(prompt_texts, prompt_tokens)},
    }
    if opts.layout.placement == "pose":
        summary["documents_dropped"] = stats.docs_dropped
        summary["tokens_in_dropped_documents"] = stats.tokens_dropped
        summary["pose"] = pose_stats(stats)
    if EOT_PROMPT in prompt_texts:  # which token the paper's EP2 became under this tokenizer
        summary["ep2"] = ep2_note(tokenizer)
    if opts.partition[1] > 1:
        summary["partition"] = list(opts.partition)
        summary["base_seed"] = term.seed
    tok_info = {}
    if tokenizer is not None:  # else none recorded: training warns it cannot check it
        spec = opts.tokenizer
        tok_info = tokenizer_identity(
            tokenizer, tokenizer_type=spec.tokenizer_type if spec else None,
            tokenizer_model=(_abs_model(spec).get("tokenizer_model", spec.tokenizer_model)
                             if spec else None)).as_dict()
    packed, layout = pack_sources(ptr.array()[:, 0], pieces.array(), P)
    header = SidecarHeader(
        layout=opts.layout.to_header(),
        terminal_source=term.source,
        terminal_length=term.length,
        prompts=prompt_texts,
        seed=seed,
        num_samples=stats.samples,
        idx_sha256=file_fingerprint(idx_path),
        idx_bytes=os.path.getsize(idx_path),
        bin_bytes=bin_bytes,
        bin_crc32=bin_block_crcs(bin_path),
        tokenizer=tok_info,
        stats=summary,
        sources={"kind": "spans", "layout": layout, "length": 0, "crc32": 0,
                 "prompt_tokens": [p.tolist() for p in prompt_tokens],
                 "eod": None if tokenizer is None else int(tokenizer.eod)},
    )
    if out_path is not None:  # a temporary of the caller's PrefixWriter
        write_sidecar(out_path, header, records.array(), packed)
        return summary
    write_sidecar_atomic(sidecar_path(prefix, opts.name), header, records.array(), packed)
    return summary


def short_documents_handling(layout: LayoutConfig, source: str) -> str:
    """What the summary says became of documents shorter than one sample."""
    if layout.placement == "pose":
        return ("those shorter than PoSE's window dropped, as documents_dropped counts: one "
                "sample per document holding the window")
    return "packed with neighbouring documents" + (
        " (contiguous positions)" if source == "document-tail" else "")


def pose_stats(stats) -> dict:
    """The ``pose`` object of a ``pose`` layout's summary: the law read, its samples, the
    documents dropped and the mean text and position skips."""
    n = max(stats.samples, 1)
    return {"law": pose_law.LAW, "samples": stats.samples,
            "documents_dropped": stats.docs_dropped,
            "text_skip_mean": stats.pose_text_skip / n,
            "position_skip_mean": stats.pose_position_skip / n}


def write_sidecar_atomic(out: str, header: SidecarHeader, records, sources) -> None:
    """Temporary + ``fsync`` + rename (+ directory ``fsync``): ``out`` is the old or the new
    sidecar at every instant; the caller holds the prefix lock."""
    remove_stale_temporaries(out)  # left by a killed build
    try:
        with atomic_path(out) as tmp:
            write_sidecar(tmp, header, records, sources)
    except OSError as exc:
        raise UserError(f"{out}: cannot write the sidecar ({exc.strerror}); make its directory "
                        "writable and check free space") from None


def _check_corpus_ids(bin_path: str, dtype, vocab_size: int, prefix: str, *, prompts: bool,
                      flag: str = "--tokenizer-model", probes: int = 64,
                      probe_bytes: int = 1 << 20) -> None:
    """Refuse a tokenizer whose vocabulary is smaller than the corpus's ids: it cannot have
    written the corpus, yet its identity would be recorded (and checked against training's
    tokenizer), and prompt ids would come from another vocabulary than the corpus's
    (``prompts``: the message says so). A sampled check, not a proof: ``probes``
    reads of ``probe_bytes`` spread evenly over the ``.bin`` (a whole-corpus scan would cost a
    full read of a multi-TB file), so it catches a foreign tokenizer, not a single stray id."""
    itemsize = np.dtype(dtype).itemsize
    size = os.path.getsize(bin_path)
    step = max(probe_bytes, size // probes)
    top = -1
    with open(bin_path, "rb") as f:
        for offset in range(0, size, step):
            f.seek(offset - offset % itemsize)
            chunk = f.read(probe_bytes - probe_bytes % itemsize)
            if chunk:
                top = max(top, int(np.frombuffer(chunk, dtype=dtype).max()))
    if top >= vocab_size:
        use = "tokenize the prompts with" if prompts else "give"
        raise UserError(f"{flag}: the corpus {prefix} holds token id {top}, beyond "
                        f"this tokenizer's vocabulary ({vocab_size}); {use} the corpus's own "
                        "tokenizer")


def _abs_model(spec: TokenizerSpec) -> dict:
    """Record an existing tokenizer path as absolute, so ``inspect`` finds it from anywhere."""
    path = spec.tokenizer_model
    return {"tokenizer_model": os.path.abspath(path)} if path and os.path.exists(path) else {}
