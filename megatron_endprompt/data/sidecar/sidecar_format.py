"""The on-disk format of the EndPrompt position sidecar (``PREFIX.endprompt``): its constants,
its header, its file name and the checksums its header carries.

The bottom of the sidecar modules: :mod:`.sidecar` (read, write, verify),
:mod:`.sidecar_checks` (every header value) and :mod:`.span_scan` (the ``sources`` pass) all
import it, and it imports none of them.

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
                 :mod:`~megatron_endprompt.data.sidecar.spans`; its length and CRC-32 are in the
                 header, so the header checksum covers them)
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from megatron_endprompt.data.tokenize.tokenizer_identity import TokenizerIdentity
from megatron_endprompt.errors import UserError
from megatron_endprompt.layout import LayoutConfig

MAGIC = b"EPSIDECR"
VERSION = 2
SUFFIX = ".endprompt"
FIXED = struct.Struct("<8sIII")
"""magic, version, header length, header CRC-32."""
MAX_HEADER = 64 << 20
CHUNK = 8 << 20
"""Bytes per sequential read or checksum step (RSS stays flat whatever the file size)."""
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
    buf = bytearray(CHUNK if nbytes is None else max(1, min(CHUNK, nbytes)))
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
    """Tokenizer identity in its on-disk form
    (:meth:`~megatron_endprompt.data.tokenize.tokenizer_identity.TokenizerIdentity.as_dict`: type,
    model, vocab_size, eod, fingerprint); empty when unknown (no check at training). Read it as
    :attr:`tokenizer_identity`."""

    stats: dict = field(default_factory=dict)
    """Preprocessing summary (documents read/skipped, tokens), for ``inspect``."""

    sources: dict = field(default_factory=dict)
    """Empty: stored sequence ``i`` of the ``.bin`` is sample ``i`` (``P + 1`` tokens). Else the
    samples are pieces of the corpus's token stream, an int64 array of ``length`` values after
    the records, interpreted by :mod:`.spans`: ``{"kind": "spans", "layout": "pieces" |
    "windows", "length": n, "crc32": crc, "prompt_tokens": [[ids], ...], "eod": id}``."""

    def layout_config(self) -> LayoutConfig:
        """The ``LayoutConfig`` the records were drawn with."""
        return LayoutConfig.from_header(self.layout)

    @property
    def tokenizer_identity(self) -> TokenizerIdentity | None:
        """The recorded :class:`TokenizerIdentity` (``None``: none recorded)."""
        return TokenizerIdentity.from_dict(self.tokenizer)


def chunked_crc32(array: np.ndarray, *, dtype: str) -> int:
    """CRC-32 of ``array``'s bytes as ``dtype``, in 8 MiB row chunks (a memory map is never
    copied whole)."""
    crc = 0
    rows = max(1, CHUNK // max(1, np.dtype(dtype).itemsize * int(np.prod(array.shape[1:]))))
    for start in range(0, len(array), rows):
        crc = zlib.crc32(np.ascontiguousarray(array[start : start + rows], dtype=dtype), crc)
    return crc


def records_crc32(records: np.ndarray) -> int:
    """CRC-32 of the int32 ``records`` (:func:`chunked_crc32`)."""
    return chunked_crc32(records, dtype="<i4")
