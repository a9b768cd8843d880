"""Test helper: rewrite a sidecar's JSON header with a *valid* header checksum (format v2: magic,
version, header length, header CRC-32 over the padded header with that field zeroed, JSON),
as a buggy writer would, so what a test exercises is the value validation, not the checksum."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable

_FIXED = struct.Struct("<8sIII")


def rewrite_header(path: str, mutate: Callable[[dict], None]) -> None:
    """Apply ``mutate`` to the decoded header dict of the sidecar at ``path`` and write it back
    (records and spans unchanged)."""
    raw = open(path, "rb").read()
    magic, version, hlen, _ = _FIXED.unpack(raw[:_FIXED.size])
    header = json.loads(raw[_FIXED.size:_FIXED.size + hlen])
    mutate(header)
    blob = json.dumps(header, sort_keys=True).encode()
    head = bytearray(_FIXED.pack(magic, version, len(blob), 0) + blob)
    head += b"\0" * (-len(head) % 8)
    head[16:20] = struct.pack("<I", zlib.crc32(head))
    offset = _FIXED.size + hlen
    offset += -offset % 8
    with open(path, "wb") as f:
        f.write(bytes(head) + raw[offset:])
