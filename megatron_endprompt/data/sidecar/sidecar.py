"""The EndPrompt position sidecar: ``PREFIX.endprompt`` beside Megatron's ``PREFIX.bin/.idx``.

Why a sidecar and not a second token stream: positions and weights of an EndPrompt sample
are a few runs (see :mod:`megatron_endprompt.layout`), so storing them per token would cost
as much as the tokens themselves. The sidecar stores ``2 * N`` int32 per sample (8 bytes
without PoSE), i.e. ~0.02% of the ``.bin`` at P=8192, and stock Megatron still reads the
``.bin/.idx`` unchanged. Several layouts of one corpus live side by side as named sidecars,
``PREFIX.NAME.endprompt`` (:func:`sidecar_path`).

File format: :mod:`~megatron_endprompt.data.sidecar.sidecar_format`.

Two levels of checking (a 1T-token corpus has a ~20 GB ``.idx``):

* :func:`open_sidecar` — cheap, every rank, every start: header checksum, every header value
  validated (:mod:`~megatron_endprompt.data.sidecar.sidecar_checks`), file sizes of the sidecar,
  ``.bin`` and ``.idx``; records memory-mapped, never copied.
* :func:`verify_sidecar` — full: records CRC and layout consistency (read in chunks), the
  ``sources`` CRC and span bounds, and the
  ``.idx`` SHA-256. Runs at preprocessing and once per file identity (see
  :mod:`~megatron_endprompt.data.sidecar.trust`), not on every rank.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import zlib
from dataclasses import asdict, dataclass, field

import numpy as np

from megatron_endprompt.data.sidecar import sidecar_format
from megatron_endprompt.data.sidecar.sidecar_checks import check_records, validate_header
from megatron_endprompt.data.sidecar.sidecar_format import (
    FIXED,
    MAGIC,
    MAX_HEADER,
    REBUILD,
    SUFFIX,
    VERSION,
    SidecarHeader,
    check_sidecar_name,
    chunked_crc32,
    data_fingerprint,
    file_crc32,
    file_fingerprint,
    records_crc32,
    sidecar_path,
)
from megatron_endprompt.data.sidecar.span_scan import verify_sources
from megatron_endprompt.disk import naming
from megatron_endprompt.errors import UserError
from megatron_endprompt.layout import LayoutConfig

#: The format's names, re-exported: callers read and write sidecars through this module.
__all__ = ["MAGIC", "REBUILD", "SUFFIX", "VERSION", "Sidecar", "SidecarHeader",
           "check_belongs_to", "check_sidecar_name", "chunked_crc32", "data_fingerprint",
           "file_crc32", "file_fingerprint", "open_sidecar", "read_sidecar", "records_crc32",
           "sidecar_path", "verify_sidecar", "write_sidecar"]

def write_sidecar(path: str, header: SidecarHeader, records: np.ndarray,
                  sources: np.ndarray | None = None) -> None:
    """Write a sidecar: the one writer every tool uses.

    ``header``: a :class:`SidecarHeader` with ``layout`` (:meth:`LayoutConfig.to_header`),
    ``terminal_source``/``terminal_length``/``prompts``/``seed``, ``num_samples`` (= rows of
    ``records`` = sequences in the ``.idx``), the data fingerprints (``**data_fingerprint(prefix)``:
    ``idx_sha256``, ``idx_bytes``, ``bin_bytes``) and ``tokenizer`` (``tokenizer_identity(...)``,
    or ``{}`` when the tokenizer is unknown). ``records``: int32 ``[num_samples, 2 * N]``
    (an array or a memory map; written and checksummed in chunks). ``sources``: int64 1-D
    for a sidecar over an existing corpus (``header.sources`` set; its ``length`` and
    ``crc32`` are filled here). ``records_crc32`` and the header checksum are filled here. Every
    value is validated before anything is written. Not atomic: the caller writes to a temporary name
    and renames.
    """
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
    head = bytearray(FIXED.pack(MAGIC, VERSION, len(blob), 0) + blob)
    head += b"\0" * (-len(head) % 8)
    head[16:20] = struct.pack("<I", zlib.crc32(head))
    rows = max(1, sidecar_format.CHUNK // (4 * records.shape[1]))
    with open(path, "wb") as f, naming(path):
        f.write(head)
        for start in range(0, len(records), rows):
            f.write(np.ascontiguousarray(records[start : start + rows], dtype="<i4").tobytes())
        if sources is not None:  # in chunks: a memory-mapped array is never copied whole
            step = sidecar_format.CHUNK // 8
            for start in range(0, len(sources), step):
                f.write(np.ascontiguousarray(sources[start : start + step], dtype="<i8").tobytes())


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


def _sidecars_beside(path: str) -> str:
    """`` (sidecars there: a.endprompt, a.L64K.endprompt)``: the sidecars in ``path``'s
    directory whose names start as its does up to the first dot (a mistyped ``--name`` shows
    the ones that exist); empty when there are none."""
    folder, base = os.path.split(path)
    stem = base.split(".", 1)[0]
    pattern = os.path.join(glob.escape(folder or "."), glob.escape(stem) + "*" + SUFFIX)
    have = sorted(os.path.basename(p) for p in glob.glob(pattern))
    if not have:
        return ""
    more = f", ... ({len(have)} in all)" if len(have) > 8 else ""
    return f" (sidecars there: {', '.join(have[:8])}{more})"


def open_sidecar(path: str) -> Sidecar:
    """Read the header (checksum, every value validated) and memory-map the records.

    Cheap: reads the header only. Raises :class:`UserError` naming the file and the fix.
    """
    if not os.path.isfile(path):
        raise UserError(f"{path}: EndPrompt sidecar not found{_sidecars_beside(path)}; "
                        f"{REBUILD}")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        fixed = f.read(FIXED.size)
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
        if len(fixed) < FIXED.size:
            raise UserError(f"{path}: truncated sidecar ({size} bytes); {REBUILD}")
        _, _, hlen, stored_crc = FIXED.unpack(fixed)
        offset = FIXED.size + hlen
        offset += -offset % 8
        if hlen > MAX_HEADER or offset > size:
            raise UserError(f"{path}: truncated or corrupt sidecar (header of {hlen} bytes in a "
                            f"file of {size}); {REBUILD}")
        head = bytearray(fixed + f.read(offset - FIXED.size))
    head[16:20] = b"\0\0\0\0"
    if zlib.crc32(head) != stored_crc:
        raise UserError(f"{path}: sidecar header fails its checksum (corrupt file); {REBUILD}")
    try:
        values = json.loads(bytes(head[FIXED.size : FIXED.size + hlen]).decode("utf-8"))
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
    header = sidecar.header
    layout = header.layout_config()
    width = layout.record_width
    rows = max(1, sidecar_format.CHUNK // (4 * width))
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
        verify_sources(sidecar, REBUILD)
    if prefix is not None:
        check_belongs_to(sidecar, prefix, full=True)


def read_sidecar(path: str, *, prefix: str | None = None, verify: bool = True) -> Sidecar:
    """:func:`open_sidecar`, then (``verify``) :func:`verify_sidecar`; with ``prefix``, check
    it belongs to ``PREFIX.bin/.idx`` (sizes always; the ``.idx`` hash when ``verify``).

    For tools that read one sidecar once; the trainer uses
    :func:`megatron_endprompt.data.sidecar.trust.ensure_verified` (verify once per file identity).
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
