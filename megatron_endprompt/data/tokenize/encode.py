"""Documents -> token ids for preprocessing, in input order: a Rust batch path and a pool path.

* **Fast path** (``--tokenizer-type HuggingFaceTokenizer`` backed by a ``tokenizers`` fast
  tokenizer): the main thread reads and parses JSON batches while a helper thread runs
  ``Tokenizer.encode_batch`` (Rust, ``--workers`` rayon threads, GIL released) on the previous
  batch, so parsing, tokenizing and writing overlap. Documents longer than ``_CHUNK_CHARS``
  are cut at single spaces between two non-space characters — a boundary every byte-level
  pre-tokenizer (GPT-2, Llama-3, Qwen) splits at anyway — and encoded chunk by chunk, so a
  63 MB line never holds a whole-document ``Encoding`` (hundreds of bytes per token) in memory.
  The ids are checked once against Megatron's own tokenizer on the first documents.
* **Pool path** (every other tokenizer): a ``multiprocessing`` pool of ``--workers`` processes
  as Megatron-LM's ``preprocess_data.py`` does, each building Megatron's tokenizer once.

Both yield ``(status, ids or None, bytes read)`` per input line.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from megatron_endprompt.data.tokenize.json_tokenizer import JsonTokenizer
from megatron_endprompt.data.tokenize.read_input import parse_line
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer
from megatron_endprompt.errors import UserError

logger = logging.getLogger(__name__)

_BATCH_LINES = 128
# A pool batch also ends at this many bytes: long documents make small batches, so the pool
# gets enough tasks to keep every worker busy to the end.
_BATCH_BYTES = 1 << 16
# Fast path: texts per encode_batch call, and the byte budget of one batch.
_FAST_BATCH_DOCS = 1024
# encode_batch holds ~250 bytes of Rust state per input character (normalized strings with
# per-byte alignments, splits, Encodings) until it returns: 256 KiB of text per call keeps
# that near 64 MiB, while still giving each rayon thread many documents.
_FAST_BATCH_BYTES = 1 << 18
_CHUNK_CHARS = 1 << 18
"""Documents longer than this are encoded in chunks of about this many characters."""
_SAFE_SPLIT = re.compile(r"(?<=\S) (?=\S)")
_SURROGATE = re.compile("[\ud800-\udfff]")


def chunk_cuts(text: str) -> list[int]:
    """Cut points ``[0, ..., len(text)]`` about every ``_CHUNK_CHARS`` characters, each at a
    single space between two non-space characters: a byte-level split pattern (GPT-2's,
    Llama-3's) starts a pre-token there whatever the context, so encoding the chunks one by
    one gives the ids of the whole text."""
    cuts = [0]
    while True:
        m = _SAFE_SPLIT.search(text, cuts[-1] + _CHUNK_CHARS)
        if m is None:
            break
        cuts.append(m.start())
    cuts.append(len(text))
    return cuts


def check_ids(where: str, ids: np.ndarray, vocab: int | None, spec: TokenizerSpec) -> None:
    """Refuse ids that the ``.bin`` dtype or the vocabulary cannot hold."""
    if int(ids.min()) < 0:  # would wrap around silently in the unsigned .bin dtype
        raise UserError(f"{where}: negative token id {int(ids.min())} from --tokenizer-type "
                        f"{spec.tokenizer_type}; token ids must be >= 0")
    if vocab is not None and int(ids.max()) >= vocab:
        raise UserError(
            f"{where}: token id {int(ids.max())} >= vocab size {vocab} of --tokenizer-type "
            f"{' '.join(filter(None, [spec.tokenizer_type, spec.tokenizer_model]))}; "
            "use the matching tokenizer"
            + (" or a larger --vocab-size" if spec.tokenizer_type == "NullTokenizer" else "")
        )


# -- pool path (worker side) ---------------------------------------------------------------
_WORKER: dict = {}


def _init_worker(spec: TokenizerSpec, json_keys: list[str], append_eod: bool) -> None:
    """Build the tokenizer once per worker process."""
    tok = build_tokenizer(spec)
    _WORKER.update(tok=tok, keys=json_keys, eod=tok.eod if append_eod else None,
                   vocab=tok.vocab_size, spec=spec)


def _encode_line(path: str, lineno: int, raw: bytes) -> tuple[str, np.ndarray | None, int]:
    status, text = parse_line(path, lineno, raw, _WORKER["keys"])
    if text is None:
        return status, None, len(raw)
    where, eod = f"{path}:{lineno}", _WORKER["eod"]
    try:
        ids = _WORKER["tok"].tokenize(text)
        # One pass from the Python ints to int64, EOD included (no np.append copy).
        ids = np.fromiter(ids if eod is None else itertools.chain(ids, (eod,)),
                          dtype=np.int64, count=len(ids) + (eod is not None))
    except Exception as exc:  # e.g. NullTokenizer on text that is not whitespace-separated ints
        check_surrogates(where, text)
        spec = _WORKER["spec"]
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UserError(f"{where}: --tokenizer-type {spec.tokenizer_type} cannot tokenize this "
                        f"text ({first}); use the matching tokenizer or fix the line") from None
    if len(ids) == 0:
        return "no tokens after tokenization", None, len(raw)
    check_ids(where, ids, _WORKER["vocab"], _WORKER["spec"])
    return "ok", ids, len(raw)


def check_surrogates(where: str, text: str) -> None:
    """One ``error:`` line for a lone surrogate (tokenizers fail cryptically on these)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as enc:
        raise UserError(
            f"{where}: lone surrogate {text[enc.start].encode('unicode_escape').decode()} at "
            f"character {enc.start + 1} of the text (half of a UTF-16 pair, e.g. a JSON "
            "\\ud800 escape); fix the producer or drop the line") from None


def _encode_batch(batch: list[tuple[str, int, bytes]]) -> list[tuple[str, np.ndarray | None, int]]:
    return [_encode_line(*item) for item in batch]


def _line_batches(lines) -> Iterator[list[tuple[str, int, bytes]]]:
    batch, size = [], 0
    for item in lines:
        batch.append(item)
        size += len(item[2])
        if len(batch) == _BATCH_LINES or size >= _BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def pool_encoded(lines, *, spec: TokenizerSpec, json_keys: list[str], append_eod: bool,
                 workers: int) -> Iterator[tuple[str, np.ndarray | None, int]]:
    """Encoded documents in input order, from a worker pool or inline (``workers == 1``)."""
    init = (spec, json_keys, append_eod)
    if workers == 1:
        _init_worker(*init)
        for batch in _line_batches(lines):
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
        pool = ctx.Pool(workers, initializer=_init_worker, initargs=init)
    with pool:
        for results in pool.imap(_encode_batch, _line_batches(lines)):
            yield from results


# -- fast path -----------------------------------------------------------------------------
def fast_backend(tokenizer):
    """The ``tokenizers.Tokenizer`` behind a Megatron ``HuggingFaceTokenizer`` whose
    ``tokenize`` is ``hf_tokenizer(text).input_ids`` (fast tokenizer, special tokens
    included, Megatron's default), else ``None``; a
    :class:`~megatron_endprompt.data.tokenize.json_tokenizer.JsonTokenizer`'s own backend (it stands
    for Megatron's only where the two were found equal)."""
    if isinstance(tokenizer, JsonTokenizer):
        return tokenizer.backend
    library = getattr(tokenizer, "_tokenizer", None)
    hf = getattr(library, "tokenizer", None)
    if hf is None or not getattr(hf, "is_fast", False):
        return None
    if not getattr(library, "include_special_tokens", True):
        return None
    return getattr(hf, "backend_tokenizer", None)


def _byte_level(backend) -> bool:
    """Whether long texts may be cut at single spaces (a byte-level pre-tokenizer)."""
    text = str(backend.pre_tokenizer.__getstate__() if backend.pre_tokenizer else "")
    return "ByteLevel" in text and backend.normalizer is None


class FastEncoder:
    """Batched Rust encoding equal to Megatron's ``HuggingFaceTokenizer.tokenize``."""

    def __init__(self, backend, *, eod: int | None) -> None:
        self.backend = backend
        self.eod = eod
        self.chunkable = _byte_level(backend)
        with_sp = backend.encode("a", add_special_tokens=True).ids
        plain = backend.encode("a", add_special_tokens=False).ids
        k = next((i for i in range(len(with_sp) - len(plain) + 1)
                  if with_sp[i : i + len(plain)] == plain), None)
        if k is None:
            self.chunkable = False
            self.prefix, self.suffix = [], []
        else:
            self.prefix, self.suffix = with_sp[:k], with_sp[k + len(plain):]

    def _batch(self, texts: list[str], *, add_special_tokens: bool):
        # encode_batch_fast (tokenizers >= 0.21) skips the character offsets: same ids, less work
        fast = getattr(self.backend, "encode_batch_fast", None)
        return (fast or self.backend.encode_batch)(texts, add_special_tokens=add_special_tokens)

    def _finish(self, ids: list[int] | np.ndarray) -> np.ndarray:
        # int32 (ids < 2**31): half the memory of int64; the .bin builder converts anyway
        out = np.empty(len(ids) + (self.eod is not None), dtype=np.int32)
        out[: len(ids)] = ids
        if self.eod is not None:
            out[-1] = self.eod
        return out

    def _encode_long(self, text: str) -> np.ndarray:
        """A long text, chunk by chunk (bounded memory; same ids as one encode)."""
        cuts = chunk_cuts(text)
        pieces = [np.asarray(self.prefix, dtype=np.int32)]
        # two chunks per call (one per rayon thread at --workers 2): the Rust state of only
        # ~512 KiB of text is alive at a time (see _FAST_BATCH_BYTES)
        for lo in range(0, len(cuts) - 1, 2):
            chunks = [text[cuts[i] : cuts[i + 1]] for i in range(lo, min(lo + 2, len(cuts) - 1))]
            for enc in self._batch(chunks, add_special_tokens=False):
                pieces.append(np.asarray(enc.ids, dtype=np.int32))
        pieces.append(np.asarray(self.suffix, dtype=np.int32))
        total = sum(map(len, pieces))
        out = np.empty(total + (self.eod is not None), dtype=np.int32)
        np.concatenate(pieces, out=out[:total])  # straight into the result: one copy
        if self.eod is not None:
            out[-1] = self.eod
        return out

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """ids (EOD appended when asked) of each text."""
        short = [i for i, t in enumerate(texts) if not (self.chunkable and len(t) > _CHUNK_CHARS)]
        out: list[np.ndarray | None] = [None] * len(texts)
        encs = self._batch([texts[i] for i in short], add_special_tokens=True)
        for i, enc in zip(short, encs):
            out[i] = self._finish(enc.ids)
        del encs
        for i, t in enumerate(texts):
            if out[i] is None:
                out[i] = self._encode_long(t)
        return out


def _text_batches(lines, keys):
    """Batches of ``(status, text, where, nbytes)`` parsed in the main thread."""
    batch, size = [], 0
    for path, lineno, raw in lines:
        status, text = parse_line(path, lineno, raw, keys)
        batch.append((status, text, f"{path}:{lineno}", len(raw)))
        size += len(raw)
        if len(batch) == _FAST_BATCH_DOCS or size >= _FAST_BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def fast_encoded(lines, encoder: FastEncoder, *, json_keys: list[str], vocab: int | None,
                 spec: TokenizerSpec) -> Iterator[tuple[str, np.ndarray | None, int]]:
    """Encoded documents in input order; batch ``k`` is tokenized while ``k + 1`` is parsed
    and ``k - 1`` is written."""

    def run(batch):
        try:
            return encoder.encode([text for status, text, _, _ in batch if text is not None])
        except Exception:
            for _, text, where, _ in batch:
                if text is not None:
                    check_surrogates(where, text)
            raise

    def results(batch, encoded):
        it = iter(encoded)
        for status, text, where, nbytes in batch:
            if text is None:
                yield status, None, nbytes
                continue
            ids = next(it)
            if len(ids) == 0:
                yield "no tokens after tokenization", None, nbytes
                continue
            check_ids(where, ids, vocab, spec)
            yield "ok", ids, nbytes

    with ThreadPoolExecutor(1) as pool:
        pending = None
        for batch in _text_batches(lines, json_keys):
            future = pool.submit(run, batch)
            if pending is not None:
                yield from results(pending[0], pending[1].result())
            pending = (batch, future)
        if pending is not None:
            yield from results(pending[0], pending[1].result())


def first_texts(lines, json_keys: list[str], *, n: int = 8) -> list[str]:
    """The texts (cut at 20,000 characters) of the first ``n`` documents, for the id probes."""
    texts = []
    for path, lineno, raw in itertools.islice(lines, 64):
        try:
            status, text = parse_line(path, lineno, raw, json_keys)
        except UserError:
            break  # reported with its line number by the real pass
        if text is not None and not _SURROGATE.search(text):  # reported by the real pass
            texts.append(text[:20000])
        if len(texts) == n:
            break
    return texts


def probe_fast_encoder(tokenizer, texts: list[str], *, append_eod: bool):
    """A :class:`FastEncoder` if the tokenizer has a fast backend that gives Megatron's ids on
    ``texts`` (the first documents); else ``None`` (the pool path is used)."""
    backend = fast_backend(tokenizer)
    if backend is None:
        return None
    encoder = FastEncoder(backend, eod=tokenizer.eod if append_eod else None)
    texts = [*texts, "Probe: \u00e9t\u00e9, 12345 tokens\n\n  spaced   words"]
    for text, ids in zip(texts, encoder.encode(texts)):
        want = list(tokenizer.tokenize(text)) + ([tokenizer.eod] if append_eod else [])
        if ids.tolist() != want:
            logger.warning("the fast tokenizer path disagrees with Megatron's tokenizer on %r; "
                           "using the slower per-document path", text[:40])
            return None
    return encoder
