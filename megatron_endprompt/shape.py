"""The shape of a dense Llama-layout decoder, shared by conversion and the run planner.

Why one class: the converter's tensor transforms, the HF ``config.json`` reader/writer and the
planner's memory/FLOP model all describe the same eight numbers; each used to carry its own
copy with its own checks. They now extend :class:`ModelShape` with what only they need
(padded vocabulary; norm epsilon and RoPE base; name and original window), and the checks
live here, once. Torch-free, so the planner imports it without loading a framework.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["ModelShape"]

_SHAPE_INTS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
               "num_query_groups", "head_dim", "vocab_size")


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """A dense Llama-layout decoder (RMSNorm, SwiGLU, GQA, RoPE; no biases except Qwen2's q/k/v
    ones, and Qwen3's per-head q/k norms)."""

    num_layers: int
    """Decoder layers ``l`` (per-layer weights are stacked ``[l, ...]`` in checkpoints)."""
    hidden_size: int
    """Model width ``h``."""
    ffn_hidden_size: int
    """SwiGLU width ``f`` (each of the gate and up projections is ``h x f``)."""
    num_attention_heads: int
    """Query heads ``n``."""
    num_query_groups: int
    """Key/value heads ``g`` (GQA groups; ``= n`` for multi-head attention)."""
    head_dim: int
    """Per-head width ``d`` (Megatron's ``kv_channels``)."""
    vocab_size: int
    """The tokenizer's vocabulary ``V`` (HF embedding rows; Megatron pads it)."""
    tied: bool = False
    """Input embedding shared with the output layer (no ``lm_head``)."""
    qkv_bias: bool = False
    """Biases on q/k/v (Qwen2 / Qwen2.5; Megatron ``--add-qkv-bias``)."""
    qk_norm: bool = False
    """Per-head RMSNorm weights ``[d]`` on q and k (Qwen3; Megatron ``--qk-layernorm``)."""

    def __post_init__(self) -> None:
        for key in _SHAPE_INTS:
            value = getattr(self, key)
            try:
                ok = not isinstance(value, bool) and operator.index(value) > 0
            except TypeError:
                ok = False
            if not ok:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not a multiple "
                             f"of the number of KV heads {self.num_query_groups}")

    def shape_fields(self) -> dict[str, Any]:
        """The :class:`ModelShape` fields of this object (to build another shape-based spec)."""
        return {f.name: getattr(self, f.name) for f in fields(ModelShape)}

    @property
    def heads_per_group(self) -> int:
        """Query heads per KV head, ``n / g``."""
        return self.num_attention_heads // self.num_query_groups

    @property
    def query_width(self) -> int:
        """``n * d``: rows of ``q_proj``, columns of ``o_proj``, width of attention's output."""
        return self.num_attention_heads * self.head_dim

    @property
    def attention_extra_params_per_layer(self) -> int:
        """Parameters of one layer beyond the Llama layout: q/k/v biases ``(n + 2g) d`` and/or
        the two per-head norms ``2 d`` (Megatron's memory formula counts neither)."""
        bias = (self.num_attention_heads + 2 * self.num_query_groups) * self.head_dim
        return (bias if self.qkv_bias else 0) + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def kv_width(self) -> int:
        """``g * d``: width of each of the key and value projections."""
        return self.num_query_groups * self.head_dim
