"""Checkpoint keys of a Llama-style ``HybridModel`` <-> those of the ``GPTModel`` it equals.

A ``HybridModel`` over a GPT layer spec with pattern ``"*-" * n`` (``|`` pipeline splits
allowed anywhere) is the same network as an ``n``-layer ``GPTModel``
(:mod:`megatron_endprompt.model.hybrid_spec`): GPT layer ``i``'s attention half (input norm,
self attention) is hybrid layer ``2i`` (``*``), its MLP half (pre-MLP norm, MLP) hybrid layer
``2i + 1`` (``-``), and ``decoder.final_layernorm`` is ``decoder.final_norm``. In a
``torch_dist`` checkpoint a hybrid model stores one tensor per layer
(``decoder.layers.{j}.<name>``, global layer index ``j``), where a GPT model stores one tensor
stacked over its layers (``decoder.layers.<name>`` of shape ``[n, ...]``); the per-layer names
are the same (the layer spec's key map puts the norms under ``linear_qkv`` / ``linear_fc1``
either way).

:class:`HybridLayers` translates both ways; any other pattern (Mamba ``M``, MoE ``E``, GDN,
multi-token prediction ``/``, an attention half without its MLP half) is refused in one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from megatron_endprompt.errors import UserError

__all__ = ["HybridLayers"]

_STACKED = "decoder.layers."
_FINAL = ("decoder.final_layernorm.weight", "decoder.final_norm.weight")
_PER_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")


@dataclass(frozen=True, kw_only=True)
class HybridLayers:
    """The key translation of one Llama-style hybrid pattern (see the module docstring)."""

    pattern: str
    """``--hybrid-layer-pattern`` as saved, e.g. ``"*-*-"`` or ``"*-|*-"``."""

    def __post_init__(self) -> None:
        layers = self.pattern.replace("|", "")
        if not re.fullmatch(r"(\*-)+", layers):
            raise UserError(
                f"--hybrid-layer-pattern {self.pattern!r} of the checkpoint is not Llama-style: "
                "only '*-' repeated (attention then MLP, '|' splits allowed) exports to HF as "
                "the GPT model it equals; Mamba (M), MoE (E), other layer kinds and MTP ('/') "
                "have no HF Llama counterpart")

    @classmethod
    def from_args(cls, args: Any) -> HybridLayers | None:
        """The checkpoint's saved args' hybrid pattern, or ``None`` for a ``GPTModel``
        checkpoint. Raises :class:`UserError` for a pattern that is not Llama-style."""
        pattern = getattr(args, "hybrid_layer_pattern", None)
        return cls(pattern=pattern) if pattern else None

    @property
    def num_layers(self) -> int:
        """``n``: layers of the equal ``GPTModel`` (half the hybrid layers)."""
        return self.pattern.count("*")

    def checkpoint_key(self, gpt_key: str, layer: int | None) -> str:
        """GPT -> hybrid: the hybrid checkpoint key of GPT layer ``layer``'s share of the
        layer-stacked GPT key ``decoder.layers.<name>`` (``layer`` ``None``: a non-layer
        tensor, e.g. the final norm)."""
        if layer is None:
            return _FINAL[1] if gpt_key == _FINAL[0] else gpt_key
        if not 0 <= layer < self.num_layers or not gpt_key.startswith(_STACKED):
            raise ValueError(f"{gpt_key} layer {layer}: not a layer of {self.pattern!r}")
        name = gpt_key[len(_STACKED):]
        if name.startswith("self_attention."):
            return f"{_STACKED}{2 * layer}.{name}"
        if name.startswith("mlp."):
            return f"{_STACKED}{2 * layer + 1}.{name}"
        raise ValueError(f"{gpt_key}: neither the attention nor the MLP half of a layer")

    def gpt_key(self, hybrid_key: str) -> tuple[str, int | None]:
        """Hybrid -> GPT: ``(layer-stacked GPT key, GPT layer)`` of a hybrid checkpoint key
        (layer ``None`` for a non-layer tensor); the inverse of :meth:`checkpoint_key`."""
        if hybrid_key == _FINAL[1]:
            return _FINAL[0], None
        match = _PER_LAYER.fullmatch(hybrid_key)
        if match is None:
            return hybrid_key, None
        j, name = int(match.group(1)), match.group(2)
        half = "self_attention." if j % 2 == 0 else "mlp."
        if j >= 2 * self.num_layers or not name.startswith(half):
            raise ValueError(f"{hybrid_key}: hybrid layer {j} of {self.pattern!r} holds no "
                             f"{name.split('.')[0]} weights")
        return _STACKED + name, j // 2
