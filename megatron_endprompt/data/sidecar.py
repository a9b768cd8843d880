"""The EndPrompt position sidecar: ``PREFIX.endprompt`` beside Megatron's ``PREFIX.bin/.idx``.

Why a sidecar and not a second token stream: positions and weights of an EndPrompt sample
are a few runs (see :mod:`megatron_endprompt.layout`), so storing them per token would cost
as much as the tokens themselves. The sidecar stores ``2 * N`` int32 per sample (8 bytes
without PoSE), i.e. ~0.02% of the ``.bin`` at P=8192, and stock Megatron still reads the
``.bin/.idx`` unchanged.

File format (little endian)::

    magic      8 bytes   b"EPSIDECR"
    version    uint32
    hlen       uint32    length of the JSON header
    header     hlen bytes, UTF-8 JSON (see SidecarHeader)
    padding    to a multiple of 8 bytes
    records    int32 [num_samples, record_width]

The header carries the layout parameters, the sample count, a CRC-32 of the records and a
fingerprint (SHA-256 and size) of the ``.idx`` plus the size of the ``.bin`` it was written
for, so a stale, truncated or mismatched sidecar is refused with a message naming both files.
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
VERSION = 1
SUFFIX = ".endprompt"
_FIXED = struct.Struct("<8sII")


def sidecar_path(prefix: str) -> str:
    """``PREFIX.endprompt``."""
    return prefix + SUFFIX


def file_fingerprint(path: str) -> str:
    """SHA-256 of a file (the ``.idx`` is small: ~12 bytes per sample)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    """Fingerprint of the ``.idx`` written together with this sidecar."""

    bin_bytes: int = 0
    """Size of the ``.bin`` written together with this sidecar."""

    records_crc32: int = 0
    """CRC-32 of the record bytes (detects corruption)."""

    tokenizer: dict = field(default_factory=dict)
    """Tokenizer type, model path, vocab size and EOD id used at preprocessing time."""

    stats: dict = field(default_factory=dict)
    """Preprocessing summary (documents read/skipped, tokens), for ``inspect``."""

    sources: dict = field(default_factory=dict)
    """Empty: stored sequence ``i`` of the ``.bin`` is sample ``i`` (``P + 1`` tokens). Else the
    samples are pieces of an existing corpus's token stream, an int64 array of ``length``
    values after the records, interpreted by :mod:`.spans`:
    ``{"kind": "spans", "length": n, "prompt_tokens": [[ids], ...], "eod": id, "crc32": crc}``."""

    def layout_config(self) -> LayoutConfig:
        """The ``LayoutConfig`` the records were drawn with."""
        return LayoutConfig(**self.layout)


def write_sidecar(path: str, header: SidecarHeader, records: np.ndarray,
                  sources: np.ndarray | None = None) -> None:
    """Write ``records`` ``[num_samples, width]`` with ``header`` to ``path`` (not atomic:
    the caller writes to a temporary name and renames); ``sources`` (int64, 1-D) for a sidecar
    over an existing corpus (``header.sources`` set, see :mod:`.spans`)."""
    records = np.ascontiguousarray(records, dtype="<i4")
    assert records.ndim == 2 and records.shape[0] == header.num_samples
    header.records_crc32 = zlib.crc32(records.tobytes())
    if sources is not None:
        sources = np.ascontiguousarray(sources, dtype="<i8")
        assert sources.ndim == 1 and header.sources
        header.sources["length"] = len(sources)
        header.sources["crc32"] = zlib.crc32(sources.tobytes())
    blob = json.dumps(asdict(header), sort_keys=True).encode("utf-8")
    head = _FIXED.pack(MAGIC, VERSION, len(blob)) + blob
    head += b"\0" * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(head)
        f.write(records.tobytes())
        if sources is not None:
            f.write(sources.tobytes())


@dataclass(kw_only=True)
class Sidecar:
    """A loaded, verified sidecar."""

    path: str
    """Where it was read from."""

    header: SidecarHeader
    """The parsed JSON header."""

    records: np.ndarray
    """int32 ``[num_samples, 2 * pose_chunks]`` (read-only memory map)."""

    sources: np.ndarray | None = None
    """int64 1-D: pieces of an existing corpus (:mod:`.spans`; ``None``: samples are stored)."""

    @property
    def layout(self) -> LayoutConfig:
        """Layout parameters the records were drawn with."""
        return self.header.layout_config()


def read_sidecar(path: str, *, prefix: str | None = None, verify: bool = True) -> Sidecar:
    """Read and check a sidecar; with ``prefix``, check it belongs to ``PREFIX.bin/.idx``.

    Raises :class:`UserError` with a one-line message naming the files and the fix.
    """
    rebuild = "re-run tools/preprocess_endprompt.py for this prefix"
    if not os.path.isfile(path):
        raise UserError(f"{path}: EndPrompt sidecar not found; {rebuild}")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        fixed = f.read(_FIXED.size)
        if len(fixed) < _FIXED.size:
            raise UserError(f"{path}: truncated sidecar ({size} bytes); {rebuild}")
        magic, version, hlen = _FIXED.unpack(fixed)
        if magic != MAGIC:
            raise UserError(f"{path}: not an EndPrompt sidecar (bad magic); {rebuild}")
        if version != VERSION:
            raise UserError(
                f"{path}: sidecar version {version}, this megatron-endprompt reads "
                f"version {VERSION}; {rebuild}"
            )
        blob = f.read(hlen)
    try:
        header = SidecarHeader(**json.loads(blob.decode("utf-8")))
        width = header.layout_config().record_width
    except (ValueError, TypeError) as exc:
        raise UserError(f"{path}: corrupt sidecar header ({exc}); {rebuild}") from None
    offset = _FIXED.size + hlen
    offset += -offset % 8
    expected = offset + header.num_samples * width * 4
    if header.sources:
        expected += int(header.sources.get("length", 0)) * 8
    if size != expected:
        raise UserError(
            f"{path}: truncated or corrupt sidecar ({size} bytes, expected {expected}); {rebuild}"
        )
    records = np.memmap(path, dtype="<i4", mode="r", offset=offset,
                        shape=(header.num_samples, width)) if header.num_samples else \
        np.empty((0, width), dtype="<i4")
    if verify and zlib.crc32(records.tobytes()) != header.records_crc32:
        raise UserError(f"{path}: sidecar records fail their checksum; {rebuild}")
    sources = None
    if header.sources:
        sources = np.memmap(path, dtype="<i8", mode="r", offset=offset + records.nbytes,
                            shape=(int(header.sources["length"]),))
        if verify and zlib.crc32(sources.tobytes()) != header.sources.get("crc32"):
            raise UserError(f"{path}: sidecar source spans fail their checksum; {rebuild}")
    sidecar = Sidecar(path=path, header=header, records=records, sources=sources)
    if prefix is not None:
        check_belongs_to(sidecar, prefix)
    return sidecar


def check_belongs_to(sidecar: Sidecar, prefix: str) -> None:
    """Refuse a sidecar that was not written together with ``PREFIX.bin/.idx``."""
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    fix = "the data was rewritten after the sidecar; re-run tools/preprocess_endprompt.py"
    for p in (idx, bin_):
        if not os.path.isfile(p):
            raise UserError(f"{sidecar.path}: its data file {p} is missing; {fix}")
    if os.path.getsize(bin_) != sidecar.header.bin_bytes:
        raise UserError(
            f"{sidecar.path} does not match {bin_} (size {os.path.getsize(bin_)}, sidecar "
            f"expects {sidecar.header.bin_bytes}); {fix}"
        )
    if file_fingerprint(idx) != sidecar.header.idx_sha256:
        raise UserError(f"{sidecar.path} does not match {idx} (fingerprint differs); {fix}")
