"""One sample of a prefix and the dataset's stats, as ``tools/inspect_endprompt.py`` shows them:
its tokens (and text, with a tokenizer given or the sidecar's recorded one still on disk), its
position runs and ids, and its loss weights.

Reads only the corpus and the sidecar: with the recorded ``tokenizer.json`` still present the
text comes from it alone (:func:`~megatron_endprompt.data.tokenize.tokenizer.json_detokenizer`), without
torch or Megatron-Core.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from megatron_endprompt.data.prepare.atomic_output import ensure_committed
from megatron_endprompt.data.sidecar.sidecar import SidecarHeader, read_sidecar, sidecar_path
from megatron_endprompt.data.sidecar.spans import sample_reader
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer, json_detokenizer
from megatron_endprompt.data.tokenize.tokenizer_identity import TokenizerIdentity
from megatron_endprompt.errors import UserError
from megatron_endprompt.layout import (
    LayoutConfig,
    context_length,
    describe_runs,
    loss_weights_from_record,
    positions_from_record,
)

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
                   tokenizer: TokenizerSpec | None = None, text: bool = True) -> dict:
    """``{"stats": ..., "sample": ...}`` of sample ``index`` of ``PREFIX`` (sidecar
    ``PREFIX[.NAME].endprompt``); ``tokenizer``: detokenize with it instead of the recorded
    one; ``text=False``: no text. Raises :class:`UserError` naming the fix."""
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
    tokens = np.asarray(sample_reader(prefix, sidecar)(index), dtype=np.int64)
    P = layout.seq_length
    record = np.asarray(sidecar.records[index])
    positions = positions_from_record(record, P)
    weights = loss_weights_from_record(record, P, context_weight=layout.context_loss_weight,
                                       terminal_weight=layout.terminal_loss_weight,
                                       predict_after_terminal=header.terminal_source != "prompt")
    a = context_length(record)
    tok = sample_tokenizer(header, tokenizer) if text else None
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
    }
    sample = {
        "index": index,
        "context_length": a,
        "terminal_length": P - a,
        "runs": [dict(token_offset=o, first_position=s, length=ln)
                 for o, s, ln in describe_runs(record, P)],
        "tokens": tokens[:P].tolist(),
        "label_token": int(tokens[P]),
        "position_ids": positions.tolist(),
        "loss_weights": weights.tolist(),
    }
    if tok is not None:
        sample["context_text"] = tok.detokenize(tokens[:a].tolist())
        sample["terminal_text"] = tok.detokenize(tokens[a:P].tolist())
    return {"stats": stats, "sample": sample}


def _compact(values: np.ndarray) -> str:
    """``0..4095, 61440..65535`` for runs of consecutive integers."""
    out, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[i - 1] + 1:
            a, b = int(values[start]), int(values[i - 1])
            out.append(f"{a}..{b}" if b > a else f"{a}")
            start = i
    return ", ".join(out)


def render_inspection(prefix: str, found: dict) -> str:
    """The human-readable form of :func:`inspect_sample`'s result."""
    stats, sample = found["stats"], found["sample"]
    layout = LayoutConfig(**stats["layout"])
    n, P, a = stats["samples"], layout.seq_length, sample["context_length"]
    tokens = sample["tokens"]
    lines = [
        f"{prefix}: {n:,} samples, P={P}, L={layout.target_length}, "
        f"placement={layout.placement}, source={stats['terminal_source']}, "
        f"pose_chunks={layout.pose_chunks}, w={layout.terminal_loss_weight}, "
        f"context weight={layout.context_loss_weight}",
        f"sidecar: {stats['sidecar_bytes']:,} bytes = "
        f"{100 * stats['sidecar_bytes'] / max(stats['bin_bytes'], 1):.4f}% of .bin; terminal "
        f"start min/mean/max {stats['terminal_start_min_mean_max']}",
        f"sample {sample['index']}: context a={a}, terminal b={P - a}",
    ]
    for run in sample["runs"]:
        lines.append(f"  tokens {run['token_offset']}..{run['token_offset'] + run['length'] - 1}"
                     f" -> positions {run['first_position']}.."
                     f"{run['first_position'] + run['length'] - 1}")
    lines.append(f"position_ids: {_compact(np.asarray(sample['position_ids']))}")
    values, first = np.unique(np.asarray(sample["loss_weights"]), return_index=True)
    lines.append("loss weights: " + ", ".join(
        f"{v:g} from token {i}"
        for v, i in sorted(zip(values.tolist(), first.tolist()), key=lambda x: x[1])))
    lines.append(f"tokens[:16]: {tokens[:16]}  terminal tokens[:16]: {tokens[a:min(a + 16, P)]}")
    if "context_text" in sample:
        ctx = sample["context_text"]
        lines.append(f"context text: {ctx[:300]!r}{' ...' if len(ctx) > 300 else ''}")
        lines.append(f"terminal text: {sample['terminal_text']!r}")
    return "\n".join(lines)
