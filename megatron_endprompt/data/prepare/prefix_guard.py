"""What a write to a prefix must never do: overwrite an input, another prefix's sidecar, or
leave a prefix's other sidecars describing a corpus that is gone; and what a merge must never
accept: a shard set with a shard missing, given twice, or from another run.

Why here, in one place: every tool that writes a prefix (preprocess, build_sidecar, merge)
meets the same three hazards, and each was a silent data loss or a wrong success.

* **Shard identity.** A partitioned preprocessing run records, in every shard's sidecar stats,
  ``partition = [index, count]``, the ``base_seed`` and a ``run_id``: a digest of what makes
  the shards one run (base seed, layout, terminal settings, partition count and the
  inputs' names and sizes; not their directories, which differ between machines).
  :func:`check_shard_set` refuses a merge whose shards are not exactly ``0..N-1`` of one run,
  in order (the merged corpus is then byte for byte one run over all the inputs).
* **File identity.** Paths are compared as files (device + inode, through symlinks and ``..``),
  never as strings: :func:`same_file`.
* **Sidecar names.** ``PREFIX.NAME.endprompt`` is also the default sidecar of a prefix
  ``PREFIX.NAME``: :func:`check_sidecar_target` refuses a write that would replace the other
  reading. :func:`check_other_sidecars` refuses new ``.bin/.idx`` under a prefix whose other
  sidecars were written for the old ones (unless the new ``.idx`` is byte-identical to theirs).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os

from megatron_endprompt.data.prepare.atomic_output import written_paths
from megatron_endprompt.data.sidecar.sidecar import (SUFFIX, SidecarHeader, open_sidecar,
                                                     sidecar_path)
from megatron_endprompt.errors import UserError

__all__ = ["run_id", "same_file", "check_inputs_not_written", "check_shard_set",
           "check_sidecar_target", "check_other_sidecars", "other_sidecars"]


def run_id(*, base_seed: int, layout: dict, terminal_source: str,
           terminal_length: int | None, count: int, inputs: list[str]) -> str:
    """Digest (16 hex digits) of what makes the shards of a partitioned run one run (the
    prompts are compared by the merge itself: they are in every header).

    ``inputs``: the expanded input files; their base names and sizes enter the digest (the
    directories do not: shards are often made on machines that mount the data elsewhere).
    """
    files = [[os.path.basename(p), os.path.getsize(p)] for p in inputs]
    blob = json.dumps({"seed": base_seed, "layout": layout, "terminal": terminal_source,
                       "b": terminal_length, "count": count,
                       "inputs": files}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def same_file(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` are one file (device and inode; symlinks followed). A path
    that does not exist is no file."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def check_inputs_not_written(inputs: list[str], prefix: str, sidecar: str, *,
                             flag: str = "--input") -> None:
    """Refuse an input file that the write of ``prefix`` (sidecar ``sidecar``) would replace,
    truncate or remove: its ``.bin``/``.idx``/sidecar, lock or commit journal, or a temporary
    of it (removed as stale). Compared as files, so a symlink or a hard link to one of them
    is caught; a JSONL corpus may be named ``x.bin`` by its owner."""
    targets = written_paths(prefix, sidecar)
    stem = os.path.basename(prefix)
    directory = os.path.realpath(os.path.dirname(os.path.abspath(prefix)))
    for path in inputs:
        hit = next((t for t in targets if same_file(path, t)), None)
        real = os.path.realpath(path)
        name = os.path.basename(real)
        if hit is None and os.path.dirname(real) == directory and \
                name.startswith(stem + ".") and ".tmp-" in name:
            hit = real
        if hit is not None:
            same = os.path.abspath(path) == os.path.abspath(hit)
            what = "a file" if same else f"the same file as {hit}, a file"
            raise UserError(f"{flag} {path} is {what} this run writes (--output-prefix "
                            f"{prefix}); choose another output prefix or move the input, so "
                            "it is not destroyed")


def _shard(header: SidecarHeader) -> tuple[int, int] | None:
    part = header.stats.get("partition") if isinstance(header.stats, dict) else None
    return (int(part[0]), int(part[1])) if part else None


def check_shard_set(inputs: list[str], headers: list[SidecarHeader]) -> None:
    """Refuse a merge of shards that are not one whole partitioned run, in order.

    Inputs that are not shards (no ``partition`` in their stats: whole runs, earlier merges)
    merge freely among themselves; each input may appear once (compared as files).
    """
    for i, prefix in enumerate(inputs):
        for j in range(i):
            if same_file(prefix + ".bin", inputs[j] + ".bin"):
                raise UserError(f"--inputs {prefix}: given twice (also as {inputs[j]}); give "
                                "each shard once")
    parts = [_shard(h) for h in headers]
    if all(p is None for p in parts):
        return
    first = next(k for k, p in enumerate(parts) if p is not None)
    idx0, count = parts[first]
    run0 = headers[first].stats.get("run_id")
    seed0 = headers[first].stats.get("base_seed")
    for prefix, part, h in zip(inputs, parts, headers):
        if part is None:
            raise UserError(f"--inputs {prefix}: not a shard of a partitioned run, while "
                            f"{inputs[first]} is shard {idx0} of {count}; merge the shards "
                            "first, then merge whole prefixes")
        if part[1] != count or h.stats.get("base_seed") != seed0 \
                or h.stats.get("run_id") != run0:
            raise UserError(f"--inputs {prefix}: shard {part[0]} of {part[1]} of another "
                            f"preprocessing run than {inputs[first]} (other partition count, "
                            "--seed or inputs); merge only the shards of one run")
    seen: dict[int, str] = {}
    for prefix, (index, _) in zip(inputs, parts):
        if index in seen:
            raise UserError(f"--inputs {prefix}: shard {index} of {count} given twice (also "
                            f"as {seen[index]}); give each shard once")
        seen[index] = prefix
    missing = sorted(set(range(count)) - set(seen))
    if missing:
        names = ", ".join(f"part{k}_of_{count}" for k in missing)
        raise UserError(f"--inputs: shard(s) {names} missing ({len(seen)} of {count} given); "
                        "a merge must hold every shard of the run")
    order = [index for index, _ in parts]
    if order != sorted(order):
        raise UserError(f"--inputs: shards given in the order {order}; give them as "
                        f"part0_of_{count} ... part{count - 1}_of_{count} (the corpus order)")


def check_sidecar_target(prefix: str, name: str | None, *, flag: str = "--name") -> None:
    """Refuse writing a sidecar file that is also another prefix's.

    ``PREFIX.NAME.endprompt`` is the default sidecar of a prefix ``PREFIX.NAME`` when that
    prefix's ``.bin`` or ``.idx`` exists; and ``PREFIX.endprompt`` of ``A.N`` (``PREFIX`` =
    ``A.N``) is ``A``'s sidecar named ``N`` when it exists and ``A.bin`` does.
    """
    target = sidecar_path(prefix, name)
    if name:
        other = f"{prefix}.{name}"
        if any(os.path.exists(other + s) for s in (".bin", ".idx")):
            raise UserError(f"{flag} {name}: {target} is also the sidecar of the prefix {other} "
                            "beside it; choose another name")
        return
    stem, dot, tail = prefix.rpartition(".")
    if dot and stem and os.path.exists(target) and os.path.exists(stem + ".bin") \
            and not os.path.exists(prefix + ".bin"):
        raise UserError(f"{target} is the sidecar named {tail!r} of the prefix {stem}; writing "
                        f"{prefix} would replace it: choose another output prefix")


def other_sidecars(prefix: str, own: str) -> list[str]:
    """The sidecars of ``prefix`` (``PREFIX.endprompt`` and ``PREFIX.*.endprompt``) other than
    ``own``, excluding the default sidecars of other prefixes ``PREFIX.X`` that have data."""
    found = []
    candidates = [prefix + SUFFIX, *glob.glob(glob.escape(prefix) + ".*" + SUFFIX)]
    for path in candidates:
        if not os.path.isfile(path) or os.path.abspath(path) == os.path.abspath(own):
            continue
        owner = path[: -len(SUFFIX)]
        if owner != prefix and os.path.exists(owner + ".bin"):
            continue  # PREFIX.X.endprompt of an existing prefix PREFIX.X: not ours
        found.append(path)
    return found


def check_other_sidecars(prefix: str, own: str, new_idx_sha256: str) -> None:
    """Refuse committing a new ``PREFIX.idx`` (SHA-256 ``new_idx_sha256``, the digest the new
    sidecar header already carries: the ``.idx`` is not read again) while another sidecar of
    the prefix describes the current data and was written for another ``.idx``: those layouts
    would silently describe a corpus that is gone."""
    others = other_sidecars(prefix, own)
    if not others or not os.path.exists(prefix + ".idx"):
        return
    for path in others:
        try:
            header = open_sidecar(path).header
        except UserError:
            continue  # unreadable already: not a layout of the current data
        if header.idx_bytes != os.path.getsize(prefix + ".idx"):
            continue  # already stale
        if header.idx_sha256 != new_idx_sha256:
            raise UserError(
                f"{prefix}: its sidecar {os.path.basename(path)} describes the corpus now in "
                f"{prefix}.bin/.idx, which this run would replace with other data; write to a "
                "new --output-prefix, or remove that sidecar first")
