"""Samples of a sidecar over an existing corpus: composed at read time from the ``.bin``.

Why: a corpus tokenized once (by Megatron-LM's ``tools/preprocess_data.py``, by this project or
by ``IndexedDatasetBuilder``) serves many layouts (32K/64K/128K, fixed/random, several ``b``)
without being rewritten. Sample ``i`` is a short list of *pieces* ``(start, length)``, read in
order and concatenated into its ``P + 1`` tokens:

* ``start >= 0``: ``stream[start : start + length]`` — a continuation window is one piece, a
  document-tail sample two (context, tail);
* ``start == -1``: the EOD token (``length == 1``); ``start <= -2``: prompt ``-2 - start`` of
  the tokenized prompt set kept in the sidecar header.

``stream`` is the ``.bin`` read as one flat array of the ``.idx`` dtype: Megatron writes the
sequences back to back, so a sequence's first token is at ``pointer / itemsize``.

The sidecar's int64 ``sources`` array is, for layout ``pieces``, ``ptr [N + 1]`` (sample ``i``
owns pieces ``ptr[i]:ptr[i+1]``) followed by the pieces ``[M, 2]``; for layout ``windows``
(continuation: one window of ``P + 1`` tokens per sample, stride ``P``) only the runs
``(first sample, first token)`` — so such a sidecar stays ~8 bytes per sample.
"""

from __future__ import annotations

import numpy as np

from megatron_endprompt.errors import UserError

EOD_PIECE = -1


def sequence_starts(index, prefix: str, bin_bytes: int) -> np.ndarray:
    """Token offsets of every *sequence* of ``index`` (Megatron's ``_IndexReader``) in the flat
    ``.bin`` stream, plus the stream's end (int64 ``[S + 1]``); refuses a ``.bin`` whose
    sequences are not stored back to back from offset 0."""
    itemsize = np.dtype(index.dtype).itemsize
    lengths = np.asarray(index.sequence_lengths, dtype=np.int64)
    pointers = np.asarray(index.sequence_pointers, dtype=np.int64)
    expected = np.concatenate([[0], np.cumsum(lengths * itemsize)])
    if len(lengths) == 0:
        raise UserError(f"{prefix}.idx: no sequences (an empty corpus); nothing to build on")
    if not np.array_equal(pointers, expected[:-1]) or expected[-1] != bin_bytes:
        raise UserError(
            f"{prefix}.bin/.idx: the sequences are not stored back to back from the start of "
            f"the .bin ({bin_bytes} bytes, the .idx describes {int(expected[-1])}); only "
            "contiguous Megatron corpora (preprocess_data.py, IndexedDatasetBuilder, add_index) "
            "are supported"
        )
    return expected // itemsize


def token_stream_bounds(index, prefix: str, bin_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Token offsets ``[start, end)`` of every *document* of ``index`` in the flat stream."""
    seq_starts = sequence_starts(index, prefix, bin_bytes)
    docs = np.asarray(index.document_indices, dtype=np.int64)
    return seq_starts[docs[:-1]], seq_starts[docs[1:]]


def pieces_of(offsets: np.ndarray) -> np.ndarray:
    """Pieces ``[k, 2]`` of one sample given as stream offsets (markers < 0 for EOD/prompts)."""
    if offsets[0] >= 0 and offsets[-1] - offsets[0] == len(offsets) - 1:  # one window
        return np.array([[offsets[0], len(offsets)]], dtype=np.int64)
    a, b = offsets[:-1], offsets[1:]
    neg_a, neg_b = a < 0, b < 0
    brk = np.where(neg_a | neg_b, (a != b) | (neg_a != neg_b), b - a != 1)
    bounds = np.concatenate([[0], np.flatnonzero(brk) + 1, [len(offsets)]])
    return np.stack([offsets[bounds[:-1]], np.diff(bounds)], axis=1).astype(np.int64)


def join_sources(ptr: np.ndarray, pieces: np.ndarray) -> np.ndarray:
    """The flat int64 ``sources`` array of ``ptr`` and ``pieces`` (layout ``pieces``)."""
    return np.concatenate([np.asarray(ptr, np.int64), np.asarray(pieces, np.int64).ravel()])


def pack_sources(ptr: np.ndarray, pieces: np.ndarray, seq_length: int) -> tuple[np.ndarray, str]:
    """``(flat int64 array, layout)`` to store. Continuation samples are windows of ``P + 1``
    tokens with stride ``P``: stored as runs ``(first sample, first token)``, a few values per
    shard instead of 24 bytes per sample (layout ``windows``); otherwise ``pieces``."""
    ptr, pieces = np.asarray(ptr, np.int64), np.asarray(pieces, np.int64).reshape(-1, 2)
    n = len(ptr) - 1
    if n > 0 and len(pieces) == n and np.all(pieces[:, 1] == seq_length + 1) \
            and np.all(pieces[:, 0] >= 0):
        starts = pieces[:, 0]
        new_run = np.flatnonzero(np.diff(starts) != seq_length) + 1
        firsts = np.concatenate([[0], new_run])
        if len(firsts) * 4 <= n:
            return np.stack([firsts, starts[firsts]], axis=1).ravel(), "windows"
    return join_sources(ptr, pieces), "pieces"


def unpack_sources(sources: np.ndarray, num_samples: int, layout: str,
                   seq_length: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ptr [N + 1], pieces [M, 2])`` of a sidecar's stored ``sources``."""
    sources = np.asarray(sources, dtype=np.int64)
    if layout == "windows":
        runs = sources.reshape(-1, 2)
        run = np.searchsorted(runs[:, 0], np.arange(num_samples), side="right") - 1
        starts = runs[run, 1] + (np.arange(num_samples) - runs[run, 0]) * seq_length
        pieces = np.stack([starts, np.full(num_samples, seq_length + 1)], axis=1)
        return np.arange(num_samples + 1, dtype=np.int64), pieces
    return sources[: num_samples + 1], sources[num_samples + 1 :].reshape(-1, 2)


def sidecar_pieces(sidecar) -> tuple[np.ndarray, np.ndarray]:
    """``(ptr, pieces)`` of a loaded spans sidecar."""
    return unpack_sources(sidecar.sources, sidecar.header.num_samples,
                          sidecar.header.sources.get("layout", "pieces"),
                          sidecar.layout.seq_length)


def sample_extent(sidecar) -> tuple[np.ndarray, np.ndarray]:
    """First and one-past-last stream offsets that each sample reads (int64 ``[N]`` each)."""
    num_samples = sidecar.header.num_samples
    ptr, pieces = sidecar_pieces(sidecar)
    owner = np.repeat(np.arange(num_samples), np.diff(ptr))
    real = pieces[:, 0] >= 0
    first = np.full(num_samples, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.zeros(num_samples, dtype=np.int64)
    np.minimum.at(first, owner[real], pieces[real, 0])
    np.maximum.at(last, owner[real], pieces[real, 0] + pieces[real, 1])
    return first, last


def verify_sources(sidecar, rebuild: str) -> None:
    """Full check of a spans sidecar's ``sources`` (part of
    :func:`~megatron_endprompt.data.sidecar.verify_sidecar`): CRC-32 (in chunks), then every
    sample's pieces add up to ``P + 1`` tokens, stream pieces lie inside the ``.bin``, markers
    name an existing prompt (with its length) or the EOD token (length 1)."""
    import zlib

    header, path = sidecar.header, sidecar.path
    src = sidecar.sources
    crc, chunk = 0, 1 << 20
    for start in range(0, len(src), chunk):
        crc = zlib.crc32(np.ascontiguousarray(src[start : start + chunk]), crc)
    if crc != header.sources["crc32"]:
        raise UserError(f"{path}: sidecar source spans fail their checksum; {rebuild}")
    n, P = header.num_samples, sidecar.layout.seq_length
    layout = header.sources.get("layout", "pieces")

    def bad(why: str) -> UserError:
        return UserError(f"{path}: impossible source spans ({why}); {rebuild}")

    if layout == "windows":
        if len(src) % 2 or (n and len(src) == 0):
            raise bad("windows need (first sample, first token) pairs")
        runs = np.asarray(src, dtype=np.int64).reshape(-1, 2)
        if len(runs) and (runs[0, 0] != 0 or np.any(np.diff(runs[:, 0]) <= 0)
                          or runs[-1, 0] >= max(n, 1) or np.any(runs[:, 1] < 0)):
            raise bad("window runs must start at sample 0, increase and point into the .bin")
    elif len(src) < n + 1:
        raise bad(f"{len(src)} values, fewer than the {n + 1} piece pointers")
    ptr, pieces = sidecar_pieces(sidecar)
    if ptr[0] != 0 or np.any(np.diff(ptr) < 1) or ptr[-1] != len(pieces):
        raise bad("piece pointers must start at 0, increase and end at the piece count")
    owner = np.repeat(np.arange(n), np.diff(ptr))
    if not np.all(np.bincount(owner, weights=pieces[:, 1], minlength=n) == P + 1):
        raise bad(f"every sample needs P + 1 = {P + 1} tokens")
    start, length = pieces[:, 0], pieces[:, 1]
    if np.any(length < 1) or np.any(start[start >= 0] + length[start >= 0] > header.bin_bytes):
        raise bad("a piece lies outside the .bin")
    if np.any(length[start == EOD_PIECE] != 1) or (
            np.any(start == EOD_PIECE) and header.sources.get("eod") is None):
        raise bad("an EOD piece needs length 1 and the EOD id in the header")
    prompt_len = np.array([len(t) for t in header.sources.get("prompt_tokens") or []] or [0])
    k = -2 - start[start <= -2]
    if np.any(k >= len(header.sources.get("prompt_tokens") or [])) or \
            np.any(prompt_len[np.minimum(k, len(prompt_len) - 1)] != length[start <= -2]):
        raise bad("a prompt piece names no prompt of the header, or has its wrong length")


class SpanReader:
    """Composes sample tokens ``[P + 1]`` from the ``.bin`` of ``prefix`` (memory-mapped lazily,
    so the reader pickles cheaply into data-loader workers)."""

    def __init__(self, prefix: str, dtype, *, ptr: np.ndarray, pieces: np.ndarray,
                 prompt_tokens: list[list[int]], eod: int | None) -> None:
        self.path = prefix + ".bin"
        self.dtype = np.dtype(dtype)
        self.ptr, self.pieces = ptr, pieces
        self.prompts = [np.asarray(p, dtype=self.dtype) for p in prompt_tokens or []]
        self.eod = None if eod is None else np.asarray([eod], dtype=self.dtype)
        self._stream: np.ndarray | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_stream"] = None
        return state

    @property
    def stream(self) -> np.ndarray:
        if self._stream is None:
            self._stream = np.memmap(self.path, dtype=self.dtype, mode="r")
        return self._stream

    def tokens(self, i: int) -> np.ndarray:
        """Tokens of sample ``i`` in the ``.bin`` dtype, ``[P + 1]``."""
        lo, hi = int(self.ptr[i]), int(self.ptr[i + 1])
        stream = self.stream
        if hi == lo + 1:
            start, n = (int(v) for v in self.pieces[lo])
            return np.array(stream[start : start + n])
        parts = []
        for start, n in self.pieces[lo:hi].tolist():
            if start >= 0:
                parts.append(stream[start : start + n])
            elif start == EOD_PIECE:
                parts.append(self.eod)
            else:
                parts.append(self.prompts[-2 - start])
        return np.concatenate(parts)


def span_reader(prefix: str, sidecar, dtype) -> SpanReader:
    """A :class:`SpanReader` for a loaded spans sidecar of ``prefix``."""
    src = sidecar.header.sources
    ptr, pieces = sidecar_pieces(sidecar)
    return SpanReader(prefix, dtype, ptr=ptr, pieces=pieces,
                      prompt_tokens=src.get("prompt_tokens") or [], eod=src.get("eod"))


def sample_reader(prefix: str, sidecar):
    """``tokens(i) -> [P + 1]`` for either sidecar kind: stored samples (``PREFIX.bin``
    sequence ``i``) or spans composed from the corpus."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    data = IndexedDataset(prefix)
    if sidecar.sources is None:
        return lambda i: np.asarray(data[i])
    return span_reader(prefix, sidecar, data.index.dtype).tokens
