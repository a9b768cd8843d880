"""The EndPrompt position sidecar: ``PREFIX.endprompt`` beside Megatron's ``PREFIX.bin/.idx``.

Why a sidecar and not a second token stream: positions and weights of an EndPrompt sample
are a few runs (see :mod:`megatron_endprompt.layout`), so storing them per token would cost
as much as the tokens themselves. The sidecar stores ``2 * N`` int32 per sample (8 bytes
without PoSE), i.e. ~0.02% of the ``.bin`` at P=8192, and stock Megatron still reads the
``.bin/.idx`` unchanged. Several layouts of one corpus live side by side as named sidecars,
``PREFIX.NAME.endprompt`` (:func:`sidecar_path`).

File format (little endian), version 2::

    magic        8 bytes   b"EPSIDECR"
    version      uint32    2
    hlen         uint32    length of the JSON header
    header_crc32 uint32    CRC-32 of bytes [0, records) with this field zeroed: the WHOLE
                           header (magic, version, length, JSON, padding)
    header       hlen bytes, UTF-8 JSON (see SidecarHeader)
    padding      zeros, to a multiple of 8 bytes
    records      int32 [num_samples, record_width]
    sources      int64 [sources.length] (only for a sidecar over an existing corpus, see
                 :mod:`~megatron_endprompt.data.spans`; its length and CRC-32 are in the
                 header, so the header checksum covers them)

Two levels of checking (issue 15: a 1T-token corpus has a ~20 GB ``.idx``):

* :func:`open_sidecar` — cheap, every rank, every start: header checksum, every header value
  validated (:mod:`~megatron_endprompt.data.sidecar_checks`), file sizes of the sidecar,
  ``.bin`` and ``.idx``; records memory-mapped, never copied.
* :func:`verify_sidecar` — full: records CRC and layout consistency (read in chunks), the
  ``sources`` CRC and span bounds, and the
  ``.idx`` SHA-256. Runs at preprocessing and once per file identity (see
  :mod:`~megatron_endprompt.data.trust`), not on every rank.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from dataclasses import asdict, dataclass, field

import numpy as np

from megatron_endprompt.errors import UserError
from megatron_endprompt.layout import LayoutConfig

MAGIC = b"EPSIDECR"
VERSION = 2
SUFFIX = ".endprompt"
_FIXED = struct.Struct("<8sIII")
_MAX_HEADER = 64 << 20
_CHUNK = 8 << 20
REBUILD = ("re-run tools/preprocess_endprompt.py for this prefix (or "
           "tools/build_endprompt_sidecar.py for an existing corpus)")


def check_sidecar_name(name: str | None) -> None:
    """``--name`` / ``--endprompt-sidecar-name``: letters, digits, ``-``, ``_`` and inner ``.``."""
    if name is None:
        return
    ok = name and all(c.isalnum() or c in "-_." for c in name) and name.strip(".") == name
    if not ok:
        raise UserError(f"sidecar name {name!r} (--name / --endprompt-sidecar-name) is not "
                        "usable; use letters, digits, '-', '_' (e.g. L64K_fixed)")


def sidecar_path(prefix: str, name: str | None = None) -> str:
    """``PREFIX.endprompt``, or ``PREFIX.NAME.endprompt`` for a named layout."""
    check_sidecar_name(name)
    return f"{prefix}.{name}{SUFFIX}" if name else prefix + SUFFIX


def _file_chunks(path: str, offset: int = 0, nbytes: int | None = None):
    """Bytes ``[offset, offset + nbytes)`` of a file (to its end when ``nbytes`` is None) as
    memoryviews of one reusable 8 MiB buffer: sequential ``read()`` calls, no memory map, so
    the process's RSS does not grow with the file (mapped pages count in it)."""
    buf = bytearray(_CHUNK if nbytes is None else max(1, min(_CHUNK, nbytes)))
    view, size = memoryview(buf), len(buf)
    left = nbytes
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        while left is None or left > 0:
            n = f.readinto(view if left is None or left >= size else view[:left])
            if not n:
                break
            if left is not None:
                left -= n
            yield view[:n]
    if left:
        raise UserError(f"{path}: truncated ({left} bytes missing at its end); {REBUILD}")


def file_fingerprint(path: str) -> str:
    """SHA-256 of a file, read sequentially in 8 MiB blocks (no memory map: RSS stays flat)."""
    digest = hashlib.sha256()
    for chunk in _file_chunks(path):
        digest.update(chunk)
    return digest.hexdigest()


def file_crc32(path: str, offset: int, nbytes: int) -> int:
    """CRC-32 of ``nbytes`` of a file from ``offset`` (sequential reads, RSS flat)."""
    crc = 0
    for chunk in _file_chunks(path, offset, nbytes):
        crc = zlib.crc32(chunk, crc)
    return crc


def data_fingerprint(prefix: str) -> dict:
    """``{idx_sha256, idx_bytes, bin_bytes}`` of ``PREFIX.idx/.bin``: the header fields that
    tie a sidecar to its data (one sequential read of the ``.idx``)."""
    return {"idx_sha256": file_fingerprint(prefix + ".idx"),
            "idx_bytes": os.path.getsize(prefix + ".idx"),
            "bin_bytes": os.path.getsize(prefix + ".bin")}


@dataclass(kw_only=True)
class SidecarHeader:
    """Everything needed to interpret the records and to check they belong to the data."""

    layout: dict
    """``LayoutConfig`` fields (seq_length, target_length, placement, pose_chunks, weights)."""

    terminal_source: str
    """``continuation``, ``document-tail`` or ``prompt``."""

    terminal_length: int | None
    """``b`` for continuation/document-tail; ``None`` for prompts (``b`` = prompt length)."""

    prompts: list[str] = field(default_factory=list)
    """The prompt set, for ``terminal_source == "prompt"``."""

    seed: int = 0
    """Seed of the per-sample generators (``(seed, sample_index)``)."""

    num_samples: int = 0
    """Rows of the record table; equals the number of sequences in the ``.idx``."""

    idx_sha256: str = ""
    """SHA-256 of the ``.idx`` written together with this sidecar."""

    idx_bytes: int = 0
    """Size of that ``.idx`` (the cheap check every rank makes)."""

    bin_bytes: int = 0
    """Size of the ``.bin`` written together with this sidecar."""

    records_crc32: int = 0
    """CRC-32 of the record bytes (filled by :func:`write_sidecar`)."""

    bin_crc32: dict = field(default_factory=dict)
    """Per-block CRC-32 of the ``.bin`` (:mod:`.bin_checksum`); empty in sidecars written
    before it existed (their tokens are not verified)."""

    tokenizer: dict = field(default_factory=dict)
    """Tokenizer identity (:func:`~megatron_endprompt.data.tokenizer_identity.tokenizer_identity`:
    type, model, vocab_size, eod, fingerprint); empty when unknown (no check at training)."""

    stats: dict = field(default_factory=dict)
    """Preprocessing summary (documents read/skipped, tokens), for ``inspect``."""

    sources: dict = field(default_factory=dict)
    """Empty: stored sequence ``i`` of the ``.bin`` is sample ``i`` (``P + 1`` tokens). Else the
    samples are pieces of the corpus's token stream, an int64 array of ``length`` values after
    the records, interpreted by :mod:`.spans`: ``{"kind": "spans", "layout": "pieces" |
    "windows", "length": n, "crc32": crc, "prompt_tokens": [[ids], ...], "eod": id}``."""

    def layout_config(self) -> LayoutConfig:
        """The ``LayoutConfig`` the records were drawn with."""
        return LayoutConfig(**self.layout)


def chunked_crc32(array: np.ndarray, *, dtype: str) -> int:
    """CRC-32 of ``array``'s bytes as ``dtype``, in 8 MiB row chunks (a memory map is never
    copied whole)."""
    crc = 0
    rows = max(1, _CHUNK // max(1, np.dtype(dtype).itemsize * int(np.prod(array.shape[1:]))))
    for start in range(0, len(array), rows):
        crc = zlib.crc32(np.ascontiguousarray(array[start : start + rows], dtype=dtype), crc)
    return crc


def records_crc32(records: np.ndarray) -> int:
    """CRC-32 of the int32 ``records`` (:func:`chunked_crc32`)."""
    return chunked_crc32(records, dtype="<i4")


def write_sidecar(path: str, header: SidecarHeader, records: np.ndarray,
                  sources: np.ndarray | None = None) -> None:
    """Write a sidecar: the one writer every tool uses.

    ``header``: a :class:`SidecarHeader` with ``layout`` (``asdict(LayoutConfig)``),
    ``terminal_source``/``terminal_length``/``prompts``/``seed``, ``num_samples`` (= rows of
    ``records`` = sequences in the ``.idx``), the data fingerprints (``**data_fingerprint(prefix)``:
    ``idx_sha256``, ``idx_bytes``, ``bin_bytes``) and ``tokenizer`` (``tokenizer_identity(...)``,
    or ``{}`` when the tokenizer is unknown). ``records``: int32 ``[num_samples, 2 * N]``
    (an array or a memory map; written and checksummed in chunks). ``sources``: int64 1-D
    for a sidecar over an existing corpus (``header.sources`` set; its ``length`` and
    ``crc32`` are filled here). ``records_crc32`` and the header checksum are filled here. Every value is validated before anything is written.
    Not atomic: the caller writes to a temporary name and renames.
    """
    from megatron_endprompt.data.sidecar_checks import validate_header

    if records.ndim != 2 or records.shape[0] != header.num_samples:
        raise ValueError(f"records shape {records.shape} does not match num_samples "
                         f"{header.num_samples}")
    header.records_crc32 = records_crc32(records)
    if sources is not None:
        if np.ndim(sources) != 1 or not header.sources:
            raise ValueError("sources must be 1-D and need header.sources")
        header.sources["length"] = len(sources)
        header.sources["crc32"] = chunked_crc32(sources, dtype="<i8")
    elif header.sources:
        raise ValueError("header.sources is set but no sources array was given")
    validate_header(asdict(header), path)
    blob = json.dumps(asdict(header), sort_keys=True, allow_nan=False).encode("utf-8")
    head = bytearray(_FIXED.pack(MAGIC, VERSION, len(blob), 0) + blob)
    head += b"\0" * (-len(head) % 8)
    head[16:20] = struct.pack("<I", zlib.crc32(head))
    rows = max(1, _CHUNK // (4 * records.shape[1]))
    with open(path, "wb") as f:
        f.write(head)
        for start in range(0, len(records), rows):
            f.write(np.ascontiguousarray(records[start : start + rows], dtype="<i4").tobytes())
        if sources is not None:  # in chunks: a memory-mapped array is never copied whole
            for start in range(0, len(sources), _CHUNK // 8):
                f.write(np.ascontiguousarray(sources[start : start + _CHUNK // 8],
                                             dtype="<i8").tobytes())


@dataclass(kw_only=True)
class Sidecar:
    """A loaded sidecar (header checked; records memory-mapped)."""

    path: str
    """Where it was read from."""

    header: SidecarHeader
    """The parsed, validated JSON header."""

    header_crc32: int
    """Checksum of the whole header (part of the trust-cache entry)."""

    records_offset: int
    """Byte offset of the records in the file."""

    records: np.ndarray
    """int32 ``[num_samples, 2 * pose_chunks]`` (read-only memory map)."""

    sources: np.ndarray | None = None
    """int64 1-D: pieces of an existing corpus (:mod:`.spans`; read-only memory map);
    ``None``: sample ``i`` is stored sequence ``i``."""

    derived: dict = field(default_factory=dict, repr=False, compare=False)
    """Values computed from the data once per process and shared by the train/valid/test
    datasets built on this sidecar (e.g. its :class:`~.spans.SpanIndex`); never written."""

    @property
    def layout(self) -> LayoutConfig:
        """Layout parameters the records were drawn with."""
        return self.header.layout_config()


def open_sidecar(path: str) -> Sidecar:
    """Read the header (checksum, every value validated) and memory-map the records.

    Cheap: reads the header only. Raises :class:`UserError` naming the file and the fix.
    """
    from megatron_endprompt.data.sidecar_checks import validate_header

    if not os.path.isfile(path):
        raise UserError(f"{path}: EndPrompt sidecar not found; {REBUILD}")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        fixed = f.read(_FIXED.size)
        if len(fixed) < 12:
            raise UserError(f"{path}: truncated sidecar ({size} bytes); {REBUILD}")
        magic, version = fixed[:8], struct.unpack("<I", fixed[8:12])[0]
        if magic != MAGIC:
            raise UserError(f"{path}: not an EndPrompt sidecar (bad magic); {REBUILD}")
        if version != VERSION:
            raise UserError(
                f"{path}: sidecar version {version}, this megatron-endprompt reads version "
                f"{VERSION} (older sidecars lack the header checksum and tokenizer identity); "
                f"{REBUILD}")
        if len(fixed) < _FIXED.size:
            raise UserError(f"{path}: truncated sidecar ({size} bytes); {REBUILD}")
        _, _, hlen, stored_crc = _FIXED.unpack(fixed)
        offset = _FIXED.size + hlen
        offset += -offset % 8
        if hlen > _MAX_HEADER or offset > size:
            raise UserError(f"{path}: truncated or corrupt sidecar (header of {hlen} bytes in a "
                            f"file of {size}); {REBUILD}")
        head = bytearray(fixed + f.read(offset - _FIXED.size))
    head[16:20] = b"\0\0\0\0"
    if zlib.crc32(head) != stored_crc:
        raise UserError(f"{path}: sidecar header fails its checksum (corrupt file); {REBUILD}")
    try:
        values = json.loads(bytes(head[_FIXED.size : _FIXED.size + hlen]).decode("utf-8"))
    except ValueError as exc:
        raise UserError(f"{path}: corrupt sidecar header ({exc}); {REBUILD}") from None
    validate_header(values, path)
    header = SidecarHeader(**values)
    width = header.layout_config().record_width
    expected = offset + header.num_samples * width * 4
    n_sources = int(header.sources["length"]) if header.sources else 0
    if size != expected + 8 * n_sources:
        raise UserError(
            f"{path}: truncated or corrupt sidecar ({size} bytes, expected "
            f"{expected + 8 * n_sources}); {REBUILD}")
    records = np.memmap(path, dtype="<i4", mode="r", offset=offset,
                        shape=(header.num_samples, width)) if header.num_samples else \
        np.empty((0, width), dtype="<i4")
    sources = None
    if header.sources:
        sources = np.memmap(path, dtype="<i8", mode="r", offset=expected, shape=(n_sources,)) \
            if n_sources else np.empty(0, dtype="<i8")
    return Sidecar(path=path, header=header, header_crc32=stored_crc, records_offset=offset,
                   records=records, sources=sources)


def verify_sidecar(sidecar: Sidecar, prefix: str | None = None) -> None:
    """Full verification: records CRC and layout consistency (sequential chunked reads into
    one reusable buffer, so RSS does not grow with the corpus) and, with ``prefix``, the
    ``.idx`` SHA-256. ~1 s per GB on one core."""
    from megatron_endprompt.data.sidecar_checks import check_records

    header = sidecar.header
    layout = header.layout_config()
    width = layout.record_width
    rows = max(1, _CHUNK // (4 * width))
    buf = np.empty((rows, width), dtype="<i4")
    crc, done, bad = 0, 0, None
    with open(sidecar.path, "rb", buffering=0) as f:
        f.seek(sidecar.records_offset)
        while done < header.num_samples:
            n = min(rows, header.num_samples - done)
            view = memoryview(buf[:n]).cast("B")
            got = f.readinto(view)
            if got != view.nbytes:
                raise UserError(f"{sidecar.path}: truncated sidecar records; {REBUILD}")
            crc = zlib.crc32(view, crc)
            if bad is None and (found := check_records(
                    buf[:n], layout, header.terminal_length,
                    header.terminal_source == "document-tail")) is not None:
                bad = (done + found[0], found[1])
            done += n
    if crc != header.records_crc32:  # corruption first; a bad layout with a good CRC next
        raise UserError(f"{sidecar.path}: sidecar records fail their checksum; {REBUILD}")
    if bad is not None:
        raise UserError(f"{sidecar.path}: sample {bad[0]} has an impossible layout ({bad[1]}); "
                        f"{REBUILD}")
    if sidecar.sources is not None:
        from megatron_endprompt.data.span_scan import verify_sources

        verify_sources(sidecar, REBUILD)
    if prefix is not None:
        check_belongs_to(sidecar, prefix, full=True)


def read_sidecar(path: str, *, prefix: str | None = None, verify: bool = True) -> Sidecar:
    """:func:`open_sidecar`, then (``verify``) :func:`verify_sidecar`; with ``prefix``, check
    it belongs to ``PREFIX.bin/.idx`` (sizes always; the ``.idx`` hash when ``verify``).

    For tools that read one sidecar once; the trainer uses
    :func:`megatron_endprompt.data.trust.ensure_verified` (verify once per file identity).
    """
    sidecar = open_sidecar(path)
    if verify:
        verify_sidecar(sidecar)
    if prefix is not None:
        check_belongs_to(sidecar, prefix, full=verify)
    return sidecar


def check_belongs_to(sidecar: Sidecar, prefix: str, *, full: bool = True) -> None:
    """Refuse a sidecar that was not written together with ``PREFIX.bin/.idx``: file sizes
    (cheap) and, when ``full``, the ``.idx`` SHA-256."""
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    fix = "the data was rewritten after the sidecar; " + REBUILD
    for p in (idx, bin_):
        if not os.path.isfile(p):
            raise UserError(f"{sidecar.path}: its data file {p} is missing; {fix}")
    for p, want in ((bin_, sidecar.header.bin_bytes), (idx, sidecar.header.idx_bytes)):
        if os.path.getsize(p) != want:
            raise UserError(f"{sidecar.path} does not match {p} (size {os.path.getsize(p)}, "
                            f"sidecar expects {want}); {fix}")
    if full and file_fingerprint(idx) != sidecar.header.idx_sha256:
        raise UserError(f"{sidecar.path} does not match {idx} (fingerprint differs); {fix}")
