"""Whole-sidecar passes over a spans sidecar's ``sources`` (:mod:`.spans`): the full
verification and the split's sample list.

Why a module of its own: these run once per file identity (verification) or once per index
cache (sample list), on one rank, where the corpus is largest (issue 15: ~10^9 samples at 1T
tokens). Each streams over blocks of :data:`~.spans.BLOCK` samples read with ``read()``
(:meth:`~.spans.SpanIndex.read`): temporaries are O(block) and no mapped page is left
counting in the process's RSS. The first start costs the checksum's sequential read plus
*one* pass: verification records the extent bounds of every *step* of :data:`STEP` samples
on the sidecar's shared :class:`~.spans.SpanIndex`, and the train/valid/test sample lists then
read only the steps that straddle their range (Megatron splits a corpus into contiguous
ranges), so a split costs a few steps' reads however large the corpus, or the block.
"""

from __future__ import annotations

import numpy as np

from megatron_endprompt.data.sidecar import spans
from megatron_endprompt.data.sidecar.sidecar_format import chunked_crc32, file_crc32
from megatron_endprompt.data.sidecar.spans import EOD_PIECE, SpanIndex
from megatron_endprompt.errors import UserError

_NONE = np.iinfo(np.int64).max
"""A marker-only sample's first stream offset (it reads no stream token)."""

STEP = 1 << 16
"""Samples per row of the extent bounds (:attr:`~.spans.SpanIndex.step_bounds`): 32 bytes
per 65,536 samples (0.5 MB at 10^9 samples); a straddling step costs one read of that many
samples. A block that is no multiple of it gets rows of one block each (:func:`_step`)."""


def _step(block: int) -> int:
    """Samples per bounds row for reads of ``block`` samples: :data:`STEP` when it divides
    the block (rows then tile every block), else the block."""
    return STEP if block % STEP == 0 else block


def _uniform(ptr: np.ndarray) -> int:
    """``k`` when every sample of a block (piece pointers ``[n + 1]``) has exactly ``k >= 1``
    pieces, else 0."""
    n = len(ptr) - 1
    k = (int(ptr[-1]) - int(ptr[0])) // n if n > 0 else 0
    return k if k >= 1 and np.all(ptr[1:] - ptr[:-1] == k) else 0


def _per_sample(ufunc, values: np.ndarray, ptr: np.ndarray, k: int) -> np.ndarray:
    """``ufunc`` reduced over each sample's pieces ``[len(ptr) - 1]``. With ``k`` pieces per
    sample (:func:`_uniform`; a document-tail sidecar has two) column by column, a few
    vectorised passes; else ``reduceat``, whose per-segment cost is ~10x at 1-2 pieces."""
    if k:
        cols = values.reshape(-1, k)
        out = cols[:, 0].copy()
        for j in range(1, k):
            ufunc(out, cols[:, j], out=out)
        return out
    return ufunc.reduceat(values, ptr[:-1] - ptr[0])


def _extent(ptr: np.ndarray, start: np.ndarray, length: np.ndarray,
            k: int) -> tuple[np.ndarray, np.ndarray]:
    """First and one-past-last stream offsets each sample of a block reads (int64
    ``[len(ptr) - 1]`` each; a sample of markers only: ``(int64 max, 0)``); ``start`` and
    ``length`` are the block's pieces' columns, ``k`` :func:`_uniform` of ``ptr``."""
    if len(ptr) < 2:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    end = start + length
    if start.min() < 0:  # EOD or prompt pieces: they read no stream token
        real = start >= 0
        start, end = np.where(real, start, _NONE), np.where(real, end, 0)
    return _per_sample(np.minimum, start, ptr, k), _per_sample(np.maximum, end, ptr, k)


def _columns(pieces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous ``start`` and ``length`` columns of pieces ``[m, 2]`` (strided views
    cost ~2x in every vectorised pass that follows)."""
    return np.ascontiguousarray(pieces[:, 0]), np.ascontiguousarray(pieces[:, 1])


def _bounds(first: np.ndarray, last: np.ndarray, step: int) -> np.ndarray:
    """``[ceil(len / step), 4]`` int64: per ``step`` samples of a block (per-sample extents
    ``first``/``last``, :func:`_extent`) the lowest and highest first offset and the lowest
    and highest end."""
    at = np.arange(0, len(first), step)
    return np.stack([np.minimum.reduceat(first, at), np.maximum.reduceat(first, at),
                     np.minimum.reduceat(last, at), np.maximum.reduceat(last, at)], axis=1)


def samples_within(sidecar, lo: int, hi: int, *, block: int | None = None) -> np.ndarray:
    """Ids (int32, ascending) of the samples of a spans sidecar whose every stream token lies
    in ``[lo, hi)``. Layout ``windows``: per run of windows, arithmetic. Layout ``pieces``:
    once the extent bounds of every step of samples are known
    (:attr:`SpanIndex.step_bounds`, from verification or an earlier split in this process),
    a step wholly inside the range is taken and one wholly outside skipped without reading,
    and only the straddling steps are read; else one streamed pass over blocks of samples,
    which records the bounds. Temporaries O(block); the result is 4 bytes per sample kept."""
    index, block = SpanIndex.of(sidecar), block or spans.BLOCK
    out, k = np.empty(index.n, dtype=np.int32), 0

    def keep(first: int, count: int) -> None:
        nonlocal k
        for a in range(0, count, block):  # in blocks: no temporary of the run's size
            m = min(block, count - a)
            out[k : k + m] = np.arange(first + a, first + a + m)
            k += m

    def read_within(a: int, z: int) -> tuple[np.ndarray, np.ndarray]:
        """Reads samples ``[a, z)``, keeps those inside the range; their extents."""
        nonlocal k
        ptr, pieces = index.read(a, z)
        first, last = _extent(ptr, *_columns(pieces), _uniform(ptr))
        ids = np.flatnonzero((first >= lo) & (last <= hi)) + a
        out[k : k + len(ids)] = ids
        k += len(ids)
        return first, last

    if index.layout == "windows":
        for first, count in _windows_within(index, lo, hi, block):
            keep(first, count)
    elif (bounds := index.step_bounds.get(step := _step(block))) is not None:
        inside = (bounds[:, 0] >= lo) & (bounds[:, 3] <= hi)
        outside = (bounds[:, 1] < lo) | (bounds[:, 2] > hi)
        for b in np.flatnonzero(~outside).tolist():
            a, z = b * step, min((b + 1) * step, index.n)
            if inside[b]:
                keep(a, z - a)
            else:
                read_within(a, z)
    else:
        rows = [_bounds(*read_within(a, min(a + block, index.n)), step)
                for a in range(0, index.n, block)]
        index.step_bounds[step] = np.concatenate(rows) if rows else np.empty((0, 4), np.int64)
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
    :func:`~megatron_endprompt.data.sidecar.sidecar.verify_sidecar`): CRC-32, then every sample's
    pieces add up to ``P + 1`` tokens, stream pieces lie inside the ``.bin``, markers name an
    existing prompt (with its length) or the EOD token (length 1). One pass over blocks of
    ``block`` samples (default :data:`~.spans.BLOCK`) after the checksum's sequential read;
    it leaves the extent bounds of every :data:`STEP` samples for :func:`samples_within`."""
    header, path = sidecar.header, sidecar.path
    index = SpanIndex.of(sidecar)
    src, block = index.sources, block or spans.BLOCK
    crc = file_crc32(index.path, index.offset, 8 * index.length) if index.path else \
        chunked_crc32(src, dtype="<i8")
    if crc != header.sources["crc32"]:
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
    markers = _MarkerCheck(header, bad)
    rows, step = [], _step(block)
    for _, _, p, pcs in index.blocks(block):
        if np.any(np.diff(p) < 1) or p[-1] > len(pieces) or len(pcs) != p[-1] - p[0]:
            raise bad("piece pointers must start at 0, increase and end at the piece count")
        start, length = _columns(pcs)
        k = _uniform(p)
        if not np.all(_per_sample(np.add, length, p, k) == P + 1):
            raise bad(f"every sample needs P + 1 = {P + 1} tokens")
        if length.min() < 1:
            raise bad("a piece lies outside the .bin")
        if start.min() < 0:
            markers(start, length)
        first, last = _extent(p, start, length, k)
        if last.max() > header.bin_bytes:
            raise bad("a piece lies outside the .bin")
        rows.append(_bounds(first, last, step))
    index.step_bounds[step] = np.concatenate(rows) if rows else np.empty((0, 4), np.int64)


class _MarkerCheck:
    """EOD pieces have length 1 and an EOD id in the header; prompt pieces name a prompt of
    the header and have its length."""

    def __init__(self, header, bad) -> None:
        prompts = header.sources.get("prompt_tokens") or []
        self.count, self.bad = len(prompts), bad
        self.lengths = np.array([len(t) for t in prompts] or [0])
        self.has_eod = header.sources.get("eod") is not None

    def __call__(self, start: np.ndarray, length: np.ndarray) -> None:
        eod = start == EOD_PIECE
        if np.any(length[eod] != 1) or (np.any(eod) and not self.has_eod):
            raise self.bad("an EOD piece needs length 1 and the EOD id in the header")
        prompt = start <= -2
        k = -2 - start[prompt]
        if np.any(k >= self.count) or \
                np.any(self.lengths[np.minimum(k, len(self.lengths) - 1)] != length[prompt]):
            raise self.bad("a prompt piece names no prompt of the header, or has its wrong "
                           "length")


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
