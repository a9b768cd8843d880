"""Per-block CRC-32 of a prefix's ``.bin``: what is verified of the tokens.

Megatron's ``.bin`` has no checksum, and the sidecar's fingerprint covers the ``.idx``
(SHA-256) and the ``.bin`` *size* only, so a flipped bit in a token read back silently. Now:

* **written**: every tool that writes a sidecar (preprocessing, ``build_endprompt_sidecar``,
  ``merge_endprompt``) records the zlib CRC-32 of each :data:`BLOCK_BYTES` block of the
  ``.bin`` in the sidecar header field ``bin_crc32`` (``{"block_bytes": B, "crcs": [...]}``;
  ~11 bytes of header per 64 MiB: ~0.7 MB for a 4 TB ``.bin``);
* **first use** (:func:`megatron_endprompt.data.sidecar.trust.ensure_verified`, once per file
  identity of sidecar/``.idx``/``.bin``, i.e. again after any write to the ``.bin``, which changes
  its ``ctime``): every block is checked;
* **every later start** (the identity is cached): :data:`SAMPLED_BLOCKS` blocks drawn at random
  are checked again.

Not verified: a change that leaves the file identity (size, mtime, ctime, inode) intact —
bit rot on the medium, a restored snapshot — in a block the per-start sample did not draw
(each start checks ``SAMPLED_BLOCKS`` of ``n`` blocks); and any ``.bin`` of a sidecar written
before this field existed (the field is empty there: nothing is checked, the sidecar stays
readable; rebuild it to get the checksums — no format-version change).

Cost: one sequential read of the ``.bin`` at write time and at first use (measured in
``benchmarks/data_path/bin_checksum.py``; zlib's CRC-32 runs at several GB/s, so the read
dominates).
"""

from __future__ import annotations

import logging
import os
import random

from megatron_endprompt.data.sidecar.sidecar import REBUILD, Sidecar, file_crc32
from megatron_endprompt.errors import UserError

logger = logging.getLogger(__name__)

__all__ = ["BLOCK_BYTES", "SAMPLED_BLOCKS", "bin_block_crcs", "verify_bin", "verify_bin_ranges"]

#: Block size of the recorded CRCs (64 MiB).
BLOCK_BYTES = 64 << 20
#: Blocks checked again at every start once the prefix was verified in full.
SAMPLED_BLOCKS = 2


def bin_block_crcs(bin_path: str, block_bytes: int = BLOCK_BYTES) -> dict:
    """The ``bin_crc32`` header value of ``bin_path``: one sequential read."""
    size = os.path.getsize(bin_path)
    crcs = [file_crc32(bin_path, off, min(block_bytes, size - off))
            for off in range(0, size, block_bytes)]
    return {"block_bytes": int(block_bytes), "crcs": crcs}


def _recorded(sidecar: Sidecar, size: int) -> tuple[int, list[int]] | None:
    rec = sidecar.header.bin_crc32
    if not rec:
        return None
    block, crcs = rec.get("block_bytes"), rec.get("crcs")
    if not (isinstance(block, int) and block > 0 and isinstance(crcs, list)
            and len(crcs) == -(-size // block)
            and all(isinstance(c, int) and 0 <= c < 1 << 32 for c in crcs)):
        raise UserError(f"{sidecar.path}: invalid sidecar header: bin_crc32 (block size or "
                        f"count does not fit a .bin of {size} bytes); {REBUILD}")
    return block, crcs


def verify_bin(sidecar: Sidecar, bin_path: str, *, sample: int | None = None) -> int:
    """Check the ``.bin`` against the sidecar's block CRCs: every block, or ``sample`` blocks
    drawn at random. Returns the number of blocks checked (0: the sidecar records none).
    Raises :class:`UserError` naming the file and the first bad block's byte range."""
    size = os.path.getsize(bin_path)
    recorded = _recorded(sidecar, size)
    if recorded is None:
        logger.info("%s records no .bin checksums (written before they existed); the tokens "
                    "of %s are not verified", sidecar.path, bin_path)
        return 0
    block, crcs = recorded
    todo = range(len(crcs))
    if sample is not None and sample < len(crcs):
        todo = sorted(random.SystemRandom().sample(range(len(crcs)), sample))
    return _check_blocks(sidecar, bin_path, size, block, crcs, todo)


def verify_bin_ranges(sidecar: Sidecar, bin_path: str,
                      ranges: list[tuple[int, int]]) -> tuple[int, int]:
    """Check the blocks of the ``.bin`` that hold the byte ranges ``[(start, stop), ...]``
    (one sample's tokens: what a reader of that sample relies on, at the cost of a block or
    two instead of the whole file). Returns ``(blocks checked, blocks recorded)``; ``(0, 0)``
    when the sidecar records none. Raises :class:`UserError` as :func:`verify_bin` does."""
    size = os.path.getsize(bin_path)
    recorded = _recorded(sidecar, size)
    if recorded is None:
        return 0, 0
    block, crcs = recorded
    todo = sorted({k for lo, hi in ranges if hi > lo
                   for k in range(lo // block, min(-(-hi // block), len(crcs)))})
    return _check_blocks(sidecar, bin_path, size, block, crcs, todo), len(crcs)


def _check_blocks(sidecar: Sidecar, bin_path: str, size: int, block: int, crcs: list[int],
                  todo) -> int:
    for i in todo:
        off = i * block
        if file_crc32(bin_path, off, min(block, size - off)) != crcs[i]:
            raise UserError(
                f"{bin_path}: bytes {off:,}..{min(off + block, size):,} fail the CRC-32 "
                f"recorded in {sidecar.path} (the token data changed or is corrupt); restore "
                "the .bin or re-run tools/preprocess_endprompt.py")
    return len(todo)
