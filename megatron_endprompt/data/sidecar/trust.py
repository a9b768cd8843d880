"""Verify once, then trust a cheap key.

Why: full verification of a prefix (SHA-256 of the ``.idx``, CRC and consistency of every
sidecar record) reads the whole ``.idx`` — ~20 GB for a 1T-token corpus — so doing it on every
rank at every start costs ~15 s and 20 GB of shared-filesystem reads per rank. Instead it runs
once per *file identity* ``(realpath, size, mtime_ns, ctime_ns, inode, device)`` of the sidecar,
``.idx`` and ``.bin``, and its verdict is cached as a small JSON file in the data cache
directory (Megatron's ``--data-cache-path``), written atomically (temporary + rename). Later
ranks and restarts compare the identities and the sidecar's header checksum — a few ``stat``
calls. Any write to a file changes its ``ctime`` (which no user call can set back), so a
tampered ``.idx`` — even same size, mtime reset — misses the cache and is verified again.

Who verifies: rank 0 of the data group, first (the dataset is constructed through Megatron's
``BlendedMegatronDatasetBuilder.build_generic_dataset``: rank 0, barrier, then the others,
which then hit the cache). At pretrain start (before ``torch.distributed`` exists) only global
rank 0 verifies; the other ranks make the cheap checks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

from megatron_endprompt.data.sidecar.bin_checksum import SAMPLED_BLOCKS, verify_bin
from megatron_endprompt.data.sidecar.sidecar import (VERSION, Sidecar, file_fingerprint,
                                                     verify_sidecar)
from megatron_endprompt.disk import write_text

logger = logging.getLogger(__name__)

CACHE_SUBDIR = os.path.join("cache", "EndPromptGPTDataset_indices")


def cache_dir(prefix: str, path_to_cache: str | None) -> str:
    """Megatron's data cache directory (``--data-cache-path``), or its default for
    ``EndPromptGPTDataset`` (``PREFIX/cache/EndPromptGPTDataset_indices``)."""
    return path_to_cache or os.path.join(prefix, CACHE_SUBDIR)


def file_identity(path: str) -> list:
    """``[realpath, size, mtime_ns, ctime_ns, inode, device]``: changes on any rewrite."""
    st = os.stat(path)
    return [os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino,
            st.st_dev]


def _entry_path(directory: str, kind: str, path: str) -> str:
    key = hashlib.sha1(os.path.realpath(path).encode(), usedforsecurity=False).hexdigest()[:20]
    return os.path.join(directory, f"endprompt-verified-{kind}-{key}.json")


def _load(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
        return entry if isinstance(entry, dict) else None
    except (OSError, ValueError):
        return None


def _store(path: str, entry: dict) -> None:
    """Atomic write; an unwritable cache only costs a re-verification next time."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_text(path, json.dumps(entry, sort_keys=True), fsync=False)
    except OSError as exc:
        logger.warning("cannot cache the verification of %s in %s (%s); it will be verified "
                       "again at the next start", entry.get("files"), path, exc.strerror)


def ensure_verified(sidecar: Sidecar, prefix: str, directory: str, *,
                    build: bool = True) -> str:
    """Make sure ``sidecar`` and ``PREFIX.bin/.idx`` passed full verification for their
    current file identities. Returns ``"cached"`` (trusted: a few ``stat`` calls),
    ``"verified"`` (this call verified and cached) or ``"deferred"`` (not in the cache and
    ``build`` is false: a later rank-0-first step verifies). Raises :class:`UserError` when
    the data fails verification (nothing is cached then)."""
    files = {p: file_identity(p) for p in (sidecar.path, prefix + ".idx", prefix + ".bin")}
    entry = {"version": VERSION, "kind": "sidecar", "files": files,
             "header_crc32": sidecar.header_crc32, "idx_sha256": sidecar.header.idx_sha256}
    where = _entry_path(directory, "sidecar", sidecar.path)
    if _load(where) == entry:
        if build:  # a few random .bin blocks again (bit rot keeps the file identity)
            verify_bin(sidecar, prefix + ".bin", sample=SAMPLED_BLOCKS)
        return "cached"
    if not build:
        return "deferred"
    verify_sidecar(sidecar, prefix)
    verify_bin(sidecar, prefix + ".bin")  # every block, once per file identity
    _store(where, entry)
    return "verified"


def idx_fingerprint(prefix: str, directory: str) -> str:
    """SHA-256 of ``PREFIX.idx`` for the index-cache key of any prefix (plain replay data
    too), computed once per file identity and cached like :func:`ensure_verified`."""
    idx = prefix + ".idx"
    files = {idx: file_identity(idx)}
    where = _entry_path(directory, "idx", idx)
    entry = _load(where)
    if entry and entry.get("files") == files and isinstance(entry.get("idx_sha256"), str):
        return entry["idx_sha256"]
    digest = file_fingerprint(idx)
    _store(where, {"version": VERSION, "kind": "idx", "files": files, "idx_sha256": digest})
    return digest
