"""Merge preprocessed shards (``PREFIX_partI_of_N``) into one prefix.

The ``.bin/.idx`` are concatenated as Megatron's ``IndexedDatasetBuilder.add_index`` does
(:class:`~megatron_endprompt.data.sidecar.indexed_io.IndexedWriter`: the same bytes, without
importing torch), so the merged corpus is byte for byte what one run over all the inputs writes. The
sidecars' records are concatenated unchanged (each shard drew its layouts from
``(seed, partition, sample)``); their spans are shifted by the tokens of the shards before them; the
fingerprints of the merged ``.idx``/``.bin`` and the header checksum are recomputed (by
:func:`~megatron_endprompt.data.sidecar.sidecar.write_sidecar`), and the shards' tokenizer identity
is carried over. The output is committed like preprocessing's
(:class:`~megatron_endprompt.data.prepare.atomic_output.PrefixWriter`: prefix lock, journaled
all-or-nothing commit). Shards with different layout parameters, terminal settings or tokenizers are
refused: their samples would not belong to one run.
"""

from __future__ import annotations

import os
from dataclasses import asdict

import numpy as np

from megatron_endprompt.data.prepare.atomic_output import PrefixWriter
from megatron_endprompt.data.sidecar.indexed_io import IndexedWriter, IndexReader
from megatron_endprompt.data.prepare.prefix_guard import (check_other_sidecars, check_shard_set,
                                                  check_sidecar_target, same_file)
from megatron_endprompt.data.sidecar.bin_checksum import bin_block_crcs
from megatron_endprompt.data.sidecar.sidecar import (SidecarHeader, file_fingerprint, read_sidecar,
                                             sidecar_path, write_sidecar)
from megatron_endprompt.data.sidecar.spans import pack_sources, sidecar_pieces
from megatron_endprompt.disk import check_writable
from megatron_endprompt.errors import UserError

_SAME = ("layout", "terminal_source", "terminal_length", "prompts")


def _check_same(first: str, h0: SidecarHeader, other: str, h: SidecarHeader) -> None:
    for key in _SAME:
        if getattr(h, key) != getattr(h0, key):
            a, b = getattr(h0, key), getattr(h, key)
            if isinstance(a, dict):
                diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
                a = {k: a.get(k) for k in diff}
                b = {k: b.get(k) for k in diff}
            raise UserError(f"--inputs {other}: {key} {b} differs from {first} ({a}); merge only "
                            "shards of one preprocessing run (same flags)")
    # the path is left out (shards are often preprocessed on machines that mount the tokenizer
    # at different paths): what decides the ids must match
    t0, t = h0.tokenizer_identity, h.tokenizer_identity
    for prefix, identity in ((first, t0), (other, t)):
        if identity is None or not identity.is_known:
            raise UserError(f"--inputs {prefix}: its sidecar records no tokenizer, so the merge "
                            "cannot check that the shards' token ids mean the same; rebuild it "
                            "with --tokenizer-type/--tokenizer-model")
    if not t0.matches(t):
        raise UserError(f"--inputs {other}: tokenizer {t.ids_part()} differs from "
                        f"{first} ({t0.ids_part()}); shards must share one tokenizer")
    if bool(h.sources) != bool(h0.sources) or \
            h.sources.get("prompt_tokens") != h0.sources.get("prompt_tokens"):
        raise UserError(f"--inputs {other}: sidecar kind or tokenized prompts differ from {first}; "
                        "re-run its preprocessing with this version")


def merge(inputs: list[str], output_prefix: str, *, name: str | None = None) -> dict:
    """Merge ``inputs`` (prefixes, in order) into ``output_prefix``; returns a summary."""
    if len(inputs) < 2:
        raise UserError("--inputs: give at least two prefixes to merge")
    out_abs = os.path.abspath(output_prefix)
    out_sidecar = sidecar_path(output_prefix, name)
    sidecars, dtypes = [], []
    for prefix in inputs:
        # as files, not strings: a symlinked directory or ``..`` names the same shard
        if os.path.abspath(prefix) == out_abs or any(
                same_file(prefix + s, output_prefix + s) for s in (".bin", ".idx")) \
                or same_file(sidecar_path(prefix, name), out_sidecar):
            raise UserError(f"--output-prefix {output_prefix} is also an input; "
                            "choose a new prefix")
        for suffix in (".bin", ".idx"):
            if not os.path.isfile(prefix + suffix):
                raise UserError(f"--inputs {prefix}: {prefix}{suffix} not found; give prefixes "
                                "without the suffix")
        sidecars.append(read_sidecar(sidecar_path(prefix, name), prefix=prefix))
        dtypes.append(IndexReader(prefix + ".idx").dtype)
    h0 = sidecars[0].header
    for prefix, sc, dtype in zip(inputs[1:], sidecars[1:], dtypes[1:]):
        _check_same(inputs[0], h0, prefix, sc.header)
        if dtype != dtypes[0]:
            raise UserError(f"--inputs {prefix}: token dtype {np.dtype(dtype).name} differs from "
                            f"{inputs[0]} ({np.dtype(dtypes[0]).name}); shards must share one "
                            "tokenizer")
    check_shard_set(inputs, [sc.header for sc in sidecars])
    check_sidecar_target(output_prefix, name, flag="--output-prefix")

    directory = os.path.dirname(out_abs)
    if not os.path.isdir(directory):
        raise UserError(f"--output-prefix {output_prefix}: {directory} is not a writable "
                        "directory")
    check_writable(out_abs, flag="--output-prefix")
    writer = PrefixWriter(output_prefix, sidecar=out_sidecar)
    tmp = writer.tmp
    builder = None
    try:
        builder = IndexedWriter(tmp[".bin"], dtypes[0])
        for prefix in inputs:
            builder.add_index(prefix)
        builder.finalize(tmp[".idx"])
        records = np.concatenate([np.asarray(sc.records) for sc in sidecars])
        sources = None
        if h0.sources:
            ptr, pieces = _merged_pieces(sidecars, np.dtype(dtypes[0]).itemsize)
            sources, layout = pack_sources(ptr, pieces, sidecars[0].layout.seq_length)
        header = SidecarHeader(**{**asdict(h0), "records_crc32": 0})
        header.num_samples = len(records)
        header.idx_sha256 = file_fingerprint(tmp[".idx"])
        header.idx_bytes = os.path.getsize(tmp[".idx"])
        header.bin_bytes = os.path.getsize(tmp[".bin"])
        header.bin_crc32 = bin_block_crcs(tmp[".bin"])
        header.stats = {"merged_from": [
            {"prefix": os.path.abspath(p), "seed": sc.header.seed,
             "samples": sc.header.num_samples, "stats": sc.header.stats}
            for p, sc in zip(inputs, sidecars)]}
        header.sources = {k: v for k, v in h0.sources.items() if k not in ("length", "crc32")}
        if sources is not None:
            header.sources["layout"] = layout
        write_sidecar(tmp[".endprompt"], header, records, sources)
        check_other_sidecars(output_prefix, out_sidecar, header.idx_sha256)
        writer.commit()
    except OSError as exc:
        raise UserError(f"--output-prefix {output_prefix}: cannot write ({exc.strerror}); "
                        "check free space and permissions") from None
    finally:
        if builder is not None:
            builder.close()  # idempotent; an aborted merge's .bin is closed before removal
        writer.close()
    return {"inputs": len(inputs), "samples": int(len(records)),
            "bin_bytes": os.path.getsize(output_prefix + ".bin"), "sidecar": out_sidecar}


def _merged_pieces(sidecars, itemsize: int) -> tuple[np.ndarray, np.ndarray]:
    """Pieces of every shard, stream offsets shifted by the tokens of the shards before it."""
    ptrs, pieces = [np.zeros(1, np.int64)], []
    token_base = piece_base = 0
    for sc in sidecars:
        ptr, pcs = sidecar_pieces(sc)
        pcs = np.array(pcs)
        pcs[pcs[:, 0] >= 0, 0] += token_base
        ptrs.append(ptr[1:] + piece_base)
        pieces.append(pcs)
        piece_base += len(pcs)
        token_base += sc.header.bin_bytes // itemsize
    return np.concatenate(ptrs), np.concatenate(pieces)
