"""A learnable NullTokenizer corpus (short repeated motifs) preprocessed into an EndPrompt
prefix: the data of the training and conversion tests and of ``benchmarks/gpu_check.sh``'s
training stages (no tokenizer file, no download)."""

from __future__ import annotations

import json
import os

import numpy as np

from megatron_endprompt.data.prepare.preprocess import PreprocessOptions, preprocess
from megatron_endprompt.data.sidecar.terminal_spec import TerminalSpec
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec
from megatron_endprompt.layout import LayoutConfig
from megatron_endprompt.loss_weights import LossWeights


def write_motif_prefix(root: str, *, seq_length: int, target_length: int, vocab: int,
                       docs: int = 150, terminal_length: int = 8,
                       terminal_loss_weight: float = 1.0, terminal: object | None = None,
                       **layout: object) -> str:
    """``root/ep`` (.bin/.idx/.endprompt) from ``docs`` documents of a 6-token motif x 12;
    ``terminal_loss_weight``: ``w`` (context weight 1); ``terminal``: a
    :class:`~megatron_endprompt.data.sidecar.terminal_spec.TerminalSpec` (default: a
    continuation of ``terminal_length`` tokens; prompts are NullTokenizer ids, e.g. a file
    line ``7 8 9``); ``layout``: other :class:`~megatron_endprompt.layout.LayoutConfig`
    fields."""
    rng = np.random.default_rng(0)
    corpus = os.path.join(root, "c.jsonl")
    with open(corpus, "w") as f:
        for _ in range(docs):
            motif = rng.integers(0, vocab - 1, 6)
            f.write(json.dumps({"text": " ".join(map(str, np.tile(motif, 12)))}) + "\n")
    out = os.path.join(root, "ep")
    preprocess(PreprocessOptions(
        inputs=[corpus], output_prefix=out, progress=False,
        tokenizer=TokenizerSpec(tokenizer_type="NullTokenizer", vocab_size=vocab),
        layout=LayoutConfig(seq_length=seq_length, target_length=target_length,
                            loss_weights=LossWeights(terminal=terminal_loss_weight, context=1.0),
                            **layout),
        terminal=terminal or TerminalSpec(source="continuation", length=terminal_length),
        append_eod=True))
    return out
