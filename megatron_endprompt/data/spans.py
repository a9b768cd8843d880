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
it reads), and the full verification and the split's sample list stream over blocks of
:data:`BLOCK` samples (issue 15).
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

    @classmethod
    def of(cls, sidecar) -> SpanIndex:
        """The index of a loaded spans sidecar (its memory map, never copied)."""
        src, header = sidecar.sources, sidecar.header
        common = dict(num_samples=header.num_samples, layout=header.sources.get("layout", "pieces"),
                      seq_length=sidecar.layout.seq_length)
        if isinstance(src, np.memmap) and src.filename:
            return cls(**common, path=src.filename, offset=src.offset, length=len(src))
        return cls(**common, sources=src)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_views"] = None
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

    def blocks(self, block: int | None = None):
        """``(lo, hi, ptr, pieces)`` for consecutive blocks of samples (see :meth:`block`)."""
        block = block or BLOCK
        for lo in range(0, self.n, block):
            hi = min(lo + block, self.n)
            yield (lo, hi, *self.block(lo, hi))


def _extent(ptr: np.ndarray, pieces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and one-past-last stream offsets each sample of a block (:meth:`SpanIndex.block`)
    reads (int64 ``[len(ptr) - 1]`` each; a sample of markers only: ``(int64 max, 0)``)."""
    if len(ptr) < 2:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    start, length = pieces[:, 0], pieces[:, 1]
    real = start >= 0
    at = ptr[:-1] - ptr[0]
    first = np.minimum.reduceat(np.where(real, start, np.iinfo(np.int64).max), at)
    last = np.maximum.reduceat(np.where(real, start + length, 0), at)
    return first, last


def unpack_sources(sources: np.ndarray, num_samples: int, layout: str,
                   seq_length: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ptr [N + 1], pieces [M, 2])`` of a sidecar's stored ``sources``, whole (for offline
    tools that rewrite a sidecar, e.g. :mod:`.merge`; readers use :class:`SpanIndex`)."""
    return SpanIndex(num_samples=num_samples, layout=layout, seq_length=seq_length,
                     sources=sources).block(0, num_samples)


def sidecar_pieces(sidecar) -> tuple[np.ndarray, np.ndarray]:
    """``(ptr, pieces)`` of a loaded spans sidecar, whole (offline tools only)."""
    return SpanIndex.of(sidecar).block(0, sidecar.header.num_samples)


def samples_within(sidecar, lo: int, hi: int, *, block: int | None = None) -> np.ndarray:
    """Ids (int32, ascending) of the samples of a spans sidecar whose every stream token lies
    in ``[lo, hi)``. Layout ``pieces``: streamed over blocks of samples; ``windows``: per run
    of windows, arithmetic. Temporaries O(block); the result is 4 bytes per sample kept."""
    index, block = SpanIndex.of(sidecar), block or BLOCK
    out, k = np.empty(index.n, dtype=np.int32), 0
    if index.layout == "windows":
        for first, count in _windows_within(index, lo, hi, block):
            for a in range(0, int(count), block):  # in blocks: no temporary of the run's size
                m = min(block, int(count) - a)
                out[k : k + m] = np.arange(first + a, first + a + m)
                k += m
    else:
        for a, _, ptr, pieces in index.blocks(block):
            first, last = _extent(ptr, pieces)
            ids = np.flatnonzero((first >= lo) & (last <= hi)) + a
            out[k : k + len(ids)] = ids
            k += len(ids)
    return out[:k] if 2 * k >= len(out) else out[:k].copy()


def _run_blocks(index: SpanIndex, block: int):
    """``(part, count)`` per block of window runs: ``part`` the block's runs ``[k(+1), 2]``
    plus the next run (whose first sample ends this block's last run), ``count [k]`` the
    windows of each run of the block (the last run of all ends at sample ``N``)."""
    runs, _ = index._v()
    R = len(runs)
    for a in range(0, R, block):
        part = np.array(runs[a : min(a + block, R) + 1])
        yield part, np.append(np.diff(part[:, 0]), index.n - part[-1, 0])[: min(block, R - a)]


def _windows_within(index: SpanIndex, lo: int, hi: int, block: int):
    """``(first sample, count)`` per run of windows: the run's windows that lie in ``[lo, hi)``
    are consecutive samples (window ``j`` reads ``token + j * P`` to ``token + j * P + P + 1``)."""
    P = index.P
    for part, count in _run_blocks(index, block):
        first, token = part[: len(count), 0], part[: len(count), 1]
        j0 = np.maximum(0, -((token - lo) // P))  # first window starting at or after lo
        j1 = np.minimum(count, (hi - P - 1 - token) // P + 1)  # windows ending at or before hi
        keep = j1 > j0
        yield from zip((first + j0)[keep].tolist(), (j1 - j0)[keep].tolist())


def verify_sources(sidecar, rebuild: str, *, block: int | None = None) -> None:
    """Full check of a spans sidecar's ``sources`` (part of
    :func:`~megatron_endprompt.data.sidecar.verify_sidecar`): CRC-32, then every sample's
    pieces add up to ``P + 1`` tokens, stream pieces lie inside the ``.bin``, markers name an
    existing prompt (with its length) or the EOD token (length 1). Streams over blocks of
    ``block`` samples (default :data:`BLOCK`): temporaries are O(block), not O(corpus)."""
    from megatron_endprompt.data.sidecar import chunked_crc32

    header, path = sidecar.header, sidecar.path
    index = SpanIndex.of(sidecar)
    src, block = index.sources, block or BLOCK
    if chunked_crc32(src, dtype="<i8") != header.sources["crc32"]:
        raise UserError(f"{path}: sidecar source spans fail their checksum; {rebuild}")
    n, P = header.num_samples, sidecar.layout.seq_length

    def bad(why: str) -> UserError:
        return UserError(f"{path}: impossible source spans ({why}); {rebuild}")

    if index.layout == "windows":
        _verify_runs(index, header.bin_bytes, bad, block)
        return
    if len(src) < n + 1 or (len(src) - n - 1) % 2:
        raise bad(f"{len(src)} values: the {n + 1} piece pointers, then (start, length) pairs")
    ptr, pieces = index._v()
    if ptr[0] != 0 or ptr[-1] != len(pieces):
        raise bad("piece pointers must start at 0, increase and end at the piece count")
    prompts = header.sources.get("prompt_tokens") or []
    prompt_len = np.array([len(t) for t in prompts] or [0])
    has_eod = header.sources.get("eod") is not None
    for lo in range(0, n, block):
        p = ptr[lo : min(lo + block, n) + 1]
        if np.any(np.diff(p) < 1) or p[-1] > len(pieces):
            raise bad("piece pointers must start at 0, increase and end at the piece count")
        pcs = pieces[int(p[0]) : int(p[-1])]
        start, length = pcs[:, 0], pcs[:, 1]
        if not np.all(np.add.reduceat(length, p[:-1] - p[0]) == P + 1):
            raise bad(f"every sample needs P + 1 = {P + 1} tokens")
        real = start >= 0
        if np.any(length < 1) or np.any(start[real] + length[real] > header.bin_bytes):
            raise bad("a piece lies outside the .bin")
        eod = start == EOD_PIECE
        if np.any(length[eod] != 1) or (np.any(eod) and not has_eod):
            raise bad("an EOD piece needs length 1 and the EOD id in the header")
        k = -2 - start[start <= -2]
        if np.any(k >= len(prompts)) or \
                np.any(prompt_len[np.minimum(k, len(prompt_len) - 1)] != length[start <= -2]):
            raise bad("a prompt piece names no prompt of the header, or has its wrong length")


def _verify_runs(index: SpanIndex, bin_bytes: int, bad, block: int) -> None:
    """Layout ``windows``: runs ``(first sample, first token)`` start at sample 0, increase,
    and every window of ``P + 1`` tokens of a run lies inside the ``.bin``."""
    src, n, P = index.sources, index.n, index.P
    if len(src) % 2 or (n and len(src) == 0):
        raise bad("windows need (first sample, first token) pairs")
    runs, _ = index._v()
    if len(runs) and runs[0, 0] != 0:
        raise bad("window runs must start at sample 0, increase and point into the .bin")
    for part, count in _run_blocks(index, block):
        firsts, tokens = part[:, 0], part[:, 1]
        if np.any(np.diff(firsts) <= 0) or firsts[-1] >= max(n, 1) or np.any(tokens < 0):
            raise bad("window runs must start at sample 0, increase and point into the .bin")
        last_end = tokens[: len(count)] + (count - 1) * P + P + 1
        if np.any(last_end > bin_bytes):
            raise bad("a piece lies outside the .bin")


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
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    data = IndexedDataset(prefix)
    if sidecar.sources is None:
        return lambda i: np.asarray(data[i])
    return span_reader(prefix, sidecar, data.index.dtype).tokens
