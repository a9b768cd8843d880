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

Readers never unpack ``sources`` (:class:`SpanIndex`): a rank's memory for them is O(samples
it reads); the full verification and the split's sample list (:mod:`.span_scan`) stream over
blocks of :data:`BLOCK` samples (issue 15).
"""

from __future__ import annotations

import numpy as np

from megatron_endprompt.data.sidecar.indexed_io import CorpusReader
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


BLOCK = 1 << 20
"""Samples per block of the streaming passes (verification, extents): their temporaries are
O(block), never O(corpus)."""

_COARSE = 1024
"""Window runs per entry of :class:`SpanIndex`'s in-memory run directory."""


class SpanIndex:
    """A sidecar's ``sources`` read in place: per-sample pieces without unpacking.

    Why: unpacked, ``ptr [N + 1]`` and ``pieces [M, 2]`` cost 24+ bytes per sample on every
    rank (~3 GB at 1T tokens) and, for layout ``windows``, expand a few runs into ``N`` rows.
    Here layout ``pieces`` is sliced straight from the memory map (a sample reads its
    ``ptr[i]:ptr[i+1]`` rows, so a rank touches the pages of the samples it reads), and layout
    ``windows`` locates a sample's run by binary search: an in-memory directory of every
    ``_COARSE``-th run's first sample (``runs / 1024`` values), then one block of the runs.
    Pickles as ``(path, offset, length)`` and re-maps in the receiving process.
    """

    def __init__(self, *, num_samples: int, layout: str, seq_length: int,
                 sources: np.ndarray | None = None, path: str | None = None,
                 offset: int = 0, length: int = 0) -> None:
        self.n, self.layout, self.P = int(num_samples), layout, int(seq_length)
        self.path, self.offset = path, int(offset)
        self.length = int(length if sources is None else len(sources))
        self._src = None if sources is None else np.asarray(sources, dtype=np.int64)
        self._views: tuple | None = None
        self.step_bounds: dict[int, np.ndarray] = {}
        """Step -> ``[ceil(n / step), 4]`` int64: per ``step`` samples the lowest and highest
        first stream offset and the lowest and highest end (:mod:`.span_scan`)."""

    @classmethod
    def of(cls, sidecar) -> SpanIndex:
        """The index of a loaded spans sidecar (its memory map, never copied); one per
        sidecar object, so the train/valid/test datasets share what it learns
        (:attr:`step_bounds`)."""
        if (index := sidecar.derived.get("span_index")) is not None:
            return index
        src, header = sidecar.sources, sidecar.header
        common = dict(num_samples=header.num_samples, layout=header.sources.get("layout", "pieces"),
                      seq_length=sidecar.layout.seq_length)
        if isinstance(src, np.memmap) and src.filename:
            index = cls(**common, path=src.filename, offset=src.offset, length=len(src))
        else:
            index = cls(**common, sources=src)
        return sidecar.derived.setdefault("span_index", index)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_views"], state["step_bounds"] = None, {}
        if self.path is not None:
            state["_src"] = None
        return state

    @property
    def sources(self) -> np.ndarray:
        """The flat int64 ``sources`` (a plain ndarray view of the memory map)."""
        if self._src is None:
            self._src = np.asarray(np.memmap(self.path, dtype="<i8", mode="r", offset=self.offset,
                                             shape=(self.length,))) if self.length else \
                np.empty(0, dtype=np.int64)
        return self._src

    def _v(self) -> tuple:
        """``(ptr, pieces)`` views (layout pieces) or ``(runs, directory)`` (windows)."""
        if self._views is None:
            src = self.sources
            if self.layout == "windows":
                runs = src[: len(src) // 2 * 2].reshape(-1, 2)
                self._views = runs, np.ascontiguousarray(runs[::_COARSE, 0])
            else:
                body = src[self.n + 1 :]
                self._views = src[: self.n + 1], body[: len(body) // 2 * 2].reshape(-1, 2)
        return self._views

    def _run_of(self, i: int) -> int:
        """Index of the window run holding sample ``i``."""
        runs, directory = self._v()
        b = max(int(np.searchsorted(directory, i, side="right")) - 1, 0)
        seg = np.ascontiguousarray(runs[b * _COARSE : (b + 1) * _COARSE, 0])
        return b * _COARSE + max(int(np.searchsorted(seg, i, side="right")) - 1, 0)

    def pieces(self, i: int) -> np.ndarray:
        """Pieces ``[k, 2]`` of sample ``i`` (a view for layout ``pieces``)."""
        if self.layout == "windows":
            runs, _ = self._v()
            first, token = (int(v) for v in runs[self._run_of(i)])
            return np.array([[token + (i - first) * self.P, self.P + 1]], dtype=np.int64)
        ptr, pieces = self._v()
        return pieces[int(ptr[i]) : int(ptr[i + 1])]

    def block(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ptr [hi - lo + 1], pieces [ptr[-1] - ptr[0], 2])`` of samples ``lo:hi``; ``ptr``
        is absolute (``pieces`` holds rows ``ptr[0]:ptr[-1]``). O(block) memory."""
        if self.layout == "windows":
            runs, _ = self._v()
            if hi <= lo:
                return np.arange(lo, lo + 1, dtype=np.int64), np.empty((0, 2), np.int64)
            r0, r1 = self._run_of(lo), self._run_of(hi - 1) + 1
            part = np.array(runs[r0:r1])
            ids = np.arange(lo, hi, dtype=np.int64)
            run = np.searchsorted(part[:, 0], ids, side="right") - 1
            starts = part[run, 1] + (ids - part[run, 0]) * self.P
            pieces = np.stack([starts, np.full(hi - lo, self.P + 1, dtype=np.int64)], axis=1)
            return np.arange(lo, hi + 1, dtype=np.int64), pieces
        ptr, pieces = self._v()
        p = ptr[lo : hi + 1]
        return p, pieces[int(p[0]) : int(p[-1])]

    def _values(self, first: int, count: int) -> np.ndarray:
        """int64 ``sources[first : first + count]`` (clipped to the array), read with
        ``read()`` into a new array when the index is file-backed: a streaming pass then never
        maps the pages it passes over, which would count in the process's RSS."""
        first = min(max(first, 0), self.length)
        count = min(max(count, 0), self.length - first)
        if self.path is None or count == 0:
            return np.array(self.sources[first : first + count])
        return np.fromfile(self.path, dtype="<i8", count=count, offset=self.offset + 8 * first)

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`block` for one pass over the data: the same values, copied (O(block)
        memory) instead of mapped. A ``ptr`` that points outside the pieces gives the rows
        that exist (verification refuses it)."""
        if self.layout == "windows":
            return self.block(lo, hi)
        ptr = self._values(lo, hi - lo + 1)
        if len(ptr) == 0:
            return ptr, np.empty((0, 2), np.int64)
        start = self.n + 1 + 2 * int(ptr[0])
        pieces = self._values(start, 2 * (int(ptr[-1]) - int(ptr[0])))
        return ptr, pieces[: len(pieces) // 2 * 2].reshape(-1, 2)

    def blocks(self, block: int | None = None):
        """``(lo, hi, ptr, pieces)`` for consecutive blocks of samples (see :meth:`read`)."""
        block = block or BLOCK
        for lo in range(0, self.n, block):
            hi = min(lo + block, self.n)
            yield (lo, hi, *self.read(lo, hi))


def sidecar_pieces(sidecar) -> tuple[np.ndarray, np.ndarray]:
    """``(ptr, pieces)`` of a loaded spans sidecar, whole (offline tools only)."""
    return SpanIndex.of(sidecar).block(0, sidecar.header.num_samples)


class SpanReader:
    """Composes sample tokens ``[P + 1]`` from the ``.bin`` of ``prefix`` (memory-mapped lazily,
    so the reader pickles cheaply into data-loader workers) and the sidecar's
    :class:`SpanIndex` (read in place: memory O(samples read))."""

    def __init__(self, prefix: str, dtype, *, index: SpanIndex,
                 prompt_tokens: list[list[int]], eod: int | None) -> None:
        self.path = prefix + ".bin"
        self.dtype = np.dtype(dtype)
        self.index = index
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
        pieces = self.index.pieces(i)
        stream = self.stream
        if len(pieces) == 1:
            start, n = (int(v) for v in pieces[0])
            return np.array(stream[start : start + n])
        parts = []
        for start, n in pieces.tolist():
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
    return SpanReader(prefix, dtype, index=SpanIndex.of(sidecar),
                      prompt_tokens=src.get("prompt_tokens") or [], eod=src.get("eod"))


def sample_reader(prefix: str, sidecar):
    """``tokens(i) -> [P + 1]`` for either sidecar kind: stored samples (``PREFIX.bin``
    sequence ``i``) or spans composed from the corpus."""
    data = CorpusReader(prefix)
    if sidecar.sources is None:
        return lambda i: np.asarray(data[i])
    return span_reader(prefix, sidecar, data.index.dtype).tokens
