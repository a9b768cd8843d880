"""One sample of a prefix and the dataset's stats, as ``tools/inspect_endprompt.py`` shows them:
its tokens (and text, with a tokenizer given or the sidecar's recorded one still on disk), its
position runs, and the arrays training gets for it (``tokens``, ``labels``, ``loss_mask``,
``position_ids``, ``terminal_mask``), made by the dataset's own
:func:`~megatron_endprompt.data.assemble.assemble_sample` so EOD masking (``--eod-mask-loss``)
and the prompt-terminal rules show as the trainer sees them. Padding ids are not masked here:
Megatron's default pad (-1) is never a stored token, and the sidecar records no pad id.

Reads only the corpus and the sidecar: with the recorded ``tokenizer.json`` still present the
text comes from it alone (:func:`~megatron_endprompt.data.tokenize.tokenizer.json_detokenizer`),
without torch or Megatron-Core.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from megatron_endprompt.data.assemble import SampleRules, assemble_sample
from megatron_endprompt.data.prepare.atomic_output import ensure_committed
from megatron_endprompt.data.sidecar.sidecar import SidecarHeader, read_sidecar, sidecar_path
from megatron_endprompt.data.sidecar.bin_checksum import verify_bin_ranges
from megatron_endprompt.data.sidecar.spans import SpanIndex, sample_byte_ranges, sample_reader
from megatron_endprompt.data.tokenize.tokenizer import (TokenizerSpec, build_tokenizer,
                                                        json_detokenizer)
from megatron_endprompt.data.tokenize.tokenizer_identity import TokenizerIdentity
from megatron_endprompt.errors import UserError
from megatron_endprompt.layout import LayoutConfig, context_length, describe_runs

__all__ = ["inspect_sample", "render_inspection", "sample_tokenizer"]


def sample_tokenizer(header: SidecarHeader, spec: TokenizerSpec | None) -> Any | None:
    """The tokenizer to show text with: ``spec``'s, else the one the header records when its
    file still exists (the recorded vocabulary alone when it suffices); ``None``: no text."""
    if spec is None:
        rec = header.tokenizer_identity
        if rec is None or (rec.tokenizer_model and not os.path.exists(rec.tokenizer_model)):
            return None
        light = json_detokenizer(rec)  # the recorded vocabulary, without torch/Megatron
        if light is not None:
            return light
        spec = TokenizerSpec(tokenizer_type=rec.tokenizer_type,
                             tokenizer_model=rec.tokenizer_model, vocab_size=rec.vocab_size)
    return build_tokenizer(spec)


def inspect_sample(prefix: str, *, index: int = 0, name: str | None = None,
                   tokenizer: TokenizerSpec | None = None, text: bool = True,
                   eod_mask_loss: bool = False) -> dict:
    """``{"stats": ..., "sample": ...}`` of sample ``index`` of ``PREFIX`` (sidecar
    ``PREFIX[.NAME].endprompt``); ``tokenizer``: detokenize with it instead of the recorded
    one; ``text=False``: no text; ``eod_mask_loss``: mask EOD inputs as training's
    ``--eod-mask-loss`` does (the EOD id from ``tokenizer``, else the recorded one). Raises
    :class:`UserError` naming the fix."""
    ensure_committed(prefix, flag="inspect")  # roll an interrupted preprocessing commit forward
    for suffix in (".bin", ".idx"):
        if not os.path.isfile(prefix + suffix):
            raise UserError(f"{prefix}{suffix}: not found; give the prefix used with "
                            "--output-prefix")
    sidecar = read_sidecar(sidecar_path(prefix, name), prefix=prefix)
    header, layout = sidecar.header, sidecar.layout
    n = header.num_samples
    if not 0 <= index < n:
        raise UserError(f"--index {index} out of range; {prefix} has {n} samples (0..{n - 1})")
    # as training does at first use, but only the blocks this sample reads (not a whole .bin)
    checked = verify_bin_ranges(sidecar, prefix + ".bin",
                                sample_byte_ranges(prefix, sidecar, index))
    tokens = np.asarray(sample_reader(prefix, sidecar)(index), dtype=np.int64)
    P = layout.seq_length
    record = np.asarray(sidecar.records[index])
    a = context_length(record)
    tok = sample_tokenizer(header, tokenizer) if text else None
    eod = _eod_id(header, tok if tokenizer is not None else None) if eod_mask_loss else None
    rules = SampleRules(seq_length=P, weights=layout.loss_weights,
                        prompt_terminal=header.terminal_source == "prompt", eod=eod)
    arrays = assemble_sample(tokens, record, rules)
    vocab = getattr(tok, "vocab_size", None) if tok is not None else None
    if vocab is not None and int(tokens.max()) >= vocab:
        rec = header.tokenizer_identity or TokenizerIdentity()
        model = (tokenizer.tokenizer_model if tokenizer is not None else None) or \
            rec.tokenizer_model
        raise UserError(f"--tokenizer-model {model}: vocabulary {vocab}, but sample "
                        f"{index} holds token id {int(tokens.max())} (the data was "
                        f"tokenized with {rec.tokenizer_type} of vocabulary "
                        f"{rec.vocab_size}); use that tokenizer or --no-text")
    terminal_starts = sidecar.records[:, 1]
    stats = {
        "samples": n,
        "bin_bytes": header.bin_bytes,
        "sidecar_bytes": os.path.getsize(sidecar.path),
        "layout": header.layout,
        "terminal_source": header.terminal_source,
        "terminal_length": header.terminal_length,
        "prompts": header.prompts,
        "seed": header.seed,
        "tokenizer": header.tokenizer,
        "terminal_start_min_mean_max": [int(terminal_starts.min()), float(terminal_starts.mean()),
                                        int(terminal_starts.max())],
        "preprocessing": header.stats,
        "bin_crc32_blocks_checked": list(checked),
    }
    sample = {
        "index": index,
        "context_length": a,
        "terminal_length": P - a,
        "runs": [dict(token_offset=o, first_position=s, length=ln)
                 for o, s, ln in describe_runs(record, P)],
        **{key: values.tolist() for key, values in arrays.items()},
    }
    if layout.placement == "pose":
        sample["pose"] = _pose_sample(sidecar, index, record)
    if tok is not None:
        sample["context_text"] = tok.detokenize(tokens[:a].tolist())
        sample["terminal_text"] = tok.detokenize(tokens[a:P].tolist())
    return {"stats": stats, "sample": sample}


def _pose_sample(sidecar, index: int, record: np.ndarray) -> dict:
    """PoSE's draws of one ``pose`` sample: its first chunk ``r1``, the position skip ``k``
    and the text skipped between its chunks (the gap between its first two corpus pieces;
    none when they are one piece)."""
    skip = None  # samples stored whole: the skip is not recorded
    if sidecar.sources is not None:
        real = [(int(s), int(n)) for s, n in SpanIndex.of(sidecar).pieces(index).tolist()
                if s >= 0]
        skip = real[1][0] - sum(real[0]) if len(real) > 1 else 0
    return {"first_chunk": int(record[2]), "position_skip": int(record[3] - record[2]),
            "text_skip": skip}


def _eod_id(header: SidecarHeader, given: Any | None) -> int:
    """The EOD id ``--eod-mask-loss`` masks: the ``given`` tokenizer's, else the recorded one."""
    eod = getattr(given, "eod", None)
    if eod is None and header.tokenizer_identity is not None:
        eod = header.tokenizer_identity.eod
    if eod is None:
        raise UserError("--eod-mask-loss: the sidecar records no EOD id; give the training "
                        "tokenizer with --tokenizer-type/--tokenizer-model")
    return int(eod)


def _compact(values: np.ndarray) -> str:
    """``0..4095, 61440..65535`` for runs of consecutive integers."""
    out, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[i - 1] + 1:
            a, b = int(values[start]), int(values[i - 1])
            out.append(f"{a}..{b}" if b > a else f"{a}")
            start = i
    return ", ".join(out)


def _crc_line(checked, index: int) -> str:
    if not checked or not checked[1]:
        return ".bin CRC-32: none recorded (sidecar written before they existed); not verified"
    return (f".bin CRC-32: ok for the {checked[0]} of {checked[1]} blocks holding sample "
            f"{index} (training checks every block at first use)")


def render_inspection(prefix: str, found: dict) -> str:
    """The human-readable form of :func:`inspect_sample`'s result."""
    stats, sample = found["stats"], found["sample"]
    layout = LayoutConfig.from_header(stats["layout"])
    n, P, a = stats["samples"], layout.seq_length, sample["context_length"]
    tokens = sample["tokens"]
    lines = [
        f"{prefix}: {n:,} samples, P={P}, L={layout.target_length}, "
        f"placement={layout.placement}, source={stats['terminal_source']}, "
        f"pose_chunks={layout.pose_chunks}, w={layout.loss_weights.terminal}, "
        f"context weight={layout.loss_weights.context}",
        f"sidecar: {stats['sidecar_bytes']:,} bytes = "
        f"{100 * stats['sidecar_bytes'] / max(stats['bin_bytes'], 1):.4f}% of .bin; terminal "
        f"start min/mean/max {stats['terminal_start_min_mean_max']}",
        f"sample {sample['index']}: context a={a}, terminal b={P - a}",
        _crc_line(stats.get("bin_crc32_blocks_checked"), sample["index"]),
    ]
    for run in sample["runs"]:
        lines.append(f"  tokens {run['token_offset']}..{run['token_offset'] + run['length'] - 1}"
                     f" -> positions {run['first_position']}.."
                     f"{run['first_position'] + run['length'] - 1}")
    if "pose" in sample:
        pose, pre = sample["pose"], stats["preprocessing"]
        dropped = pre.get("documents_dropped")  # a merged prefix keeps it per shard
        lines.append(f"PoSE ({pre.get('pose', {}).get('law', 'train_pose.py')}): first chunk "
                     f"r1={pose['first_chunk']}, text skip {pose['text_skip']} tokens, "
                     f"position skip k={pose['position_skip']}"
                     + (f"; documents dropped (shorter than the window): {dropped:,}"
                        if dropped is not None else ""))
    lines.append(f"position_ids: {_compact(np.asarray(sample['position_ids']))}")
    values, first = np.unique(np.asarray(sample["loss_mask"]), return_index=True)
    lines.append("loss weights: " + ", ".join(
        f"{v:g} from token {i}"
        for v, i in sorted(zip(values.tolist(), first.tolist()), key=lambda x: x[1])))
    lines.append(f"tokens[:16]: {tokens[:16]}  terminal tokens[:16]: {tokens[a:min(a + 16, P)]}")
    if "context_text" in sample:
        ctx = sample["context_text"]
        lines.append(f"context text: {ctx[:300]!r}{' ...' if len(ctx) > 300 else ''}")
        lines.append(f"terminal text: {sample['terminal_text']!r}")
    return "\n".join(lines)
