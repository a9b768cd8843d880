"""The Hugging Face Llama <-> Megatron-Core weight mapping, declared as data.

One :class:`WeightMapping` per Megatron tensor: its name in the Megatron module ``state_dict``
(local layer spec), its name in the Transformer Engine layer spec (which is also the name under
which *both* specs store it in a ``torch_dist`` checkpoint: the local spec maps
``input_layernorm.`` / ``pre_mlp_layernorm.`` onto TE's names in ``sharded_state_dict``), the HF
tensor name(s) and the transform between them. ``{layer}`` stands for the decoder layer index.

Transforms (``H`` hidden, ``d`` head dim, ``nh`` query heads, ``ng`` query groups = KV heads,
``F`` FFN size, ``V`` vocabulary, ``Vp`` padded vocabulary):

* ``IDENTITY``: same tensor.
* ``QKV``: HF ``q [nh*d, H]``, ``k [ng*d, H]``, ``v [ng*d, H]`` <-> Megatron ``linear_qkv
  [(nh + 2*ng)*d, H]`` fused per query group: ``[q heads of group g, k_g, v_g]`` for
  ``g = 0..ng-1`` (the layout Megatron's attention splits, and the one tensor parallelism shards
  by whole groups, so a checkpoint's global tensor is the same at every TP).
* ``GATE_UP``: HF ``gate [F, H]``, ``up [F, H]`` <-> ``linear_fc1 [2F, H]`` = ``cat(gate, up)``
  (the global layout of a SwiGLU ``linear_fc1`` in a ``torch_dist`` checkpoint at any TP).
* ``VOCAB``: HF ``[V, H]`` <-> Megatron ``[Vp, H]``: zero rows appended on the way in, removed on
  the way out.

Both directions use the same table, so a round trip is bit-exact by construction.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "LLAMA_MAPPINGS",
    "Dims",
    "Transform",
    "WeightMapping",
    "expand",
    "hf_names",
    "megatron_shape",
    "to_hf",
    "to_megatron",
]


class Transform(enum.Enum):
    """How one Megatron tensor is made from its HF tensor(s)."""

    IDENTITY = "identity"
    QKV = "qkv"
    GATE_UP = "gate_up"
    VOCAB = "vocab"


@dataclass(frozen=True, kw_only=True)
class WeightMapping:
    """One Megatron tensor and the HF tensor(s) it is made of.

    ``megatron``: module ``state_dict`` name with the local layer spec; ``te``: name with the TE
    layer spec (and in ``torch_dist`` checkpoints), ``None`` when it is the same; ``hf``: HF name
    patterns, in the order the transform takes them; ``per_layer``: the names contain
    ``{layer}``; ``untied_only``: absent when input and output embeddings are tied.
    """

    megatron: str
    hf: tuple[str, ...]
    transform: Transform
    te: str | None = None
    per_layer: bool = False
    untied_only: bool = False

    def megatron_name(self, *, layer: int | None = None, te_spec: bool = False) -> str:
        """Megatron module name (local spec unless ``te_spec``) for this layer."""
        name = self.te if te_spec and self.te else self.megatron
        return name.format(layer=layer) if self.per_layer else name

    def hf_names(self, *, layer: int | None = None) -> tuple[str, ...]:
        """HF tensor names for this layer."""
        return tuple(n.format(layer=layer) if self.per_layer else n for n in self.hf)

    def checkpoint_key(self) -> str:
        """Key of the (layer-stacked) global tensor in a ``torch_dist`` checkpoint."""
        name = self.te or self.megatron
        return name.replace("decoder.layers.{layer}.", "decoder.layers.")


_L = "decoder.layers.{layer}."
_H = "model.layers.{layer}."

#: The Llama / Mistral mapping (RMSNorm, SwiGLU, RoPE, GQA, no biases).
LLAMA_MAPPINGS: tuple[WeightMapping, ...] = (
    WeightMapping(megatron="embedding.word_embeddings.weight",
                  hf=("model.embed_tokens.weight",), transform=Transform.VOCAB),
    WeightMapping(megatron=_L + "input_layernorm.weight",
                  te=_L + "self_attention.linear_qkv.layer_norm_weight",
                  hf=(_H + "input_layernorm.weight",), transform=Transform.IDENTITY,
                  per_layer=True),
    WeightMapping(megatron=_L + "self_attention.linear_qkv.weight",
                  hf=(_H + "self_attn.q_proj.weight", _H + "self_attn.k_proj.weight",
                      _H + "self_attn.v_proj.weight"),
                  transform=Transform.QKV, per_layer=True),
    WeightMapping(megatron=_L + "self_attention.linear_proj.weight",
                  hf=(_H + "self_attn.o_proj.weight",), transform=Transform.IDENTITY,
                  per_layer=True),
    WeightMapping(megatron=_L + "pre_mlp_layernorm.weight",
                  te=_L + "mlp.linear_fc1.layer_norm_weight",
                  hf=(_H + "post_attention_layernorm.weight",), transform=Transform.IDENTITY,
                  per_layer=True),
    WeightMapping(megatron=_L + "mlp.linear_fc1.weight",
                  hf=(_H + "mlp.gate_proj.weight", _H + "mlp.up_proj.weight"),
                  transform=Transform.GATE_UP, per_layer=True),
    WeightMapping(megatron=_L + "mlp.linear_fc2.weight",
                  hf=(_H + "mlp.down_proj.weight",), transform=Transform.IDENTITY,
                  per_layer=True),
    WeightMapping(megatron="decoder.final_layernorm.weight", hf=("model.norm.weight",),
                  transform=Transform.IDENTITY),
    WeightMapping(megatron="output_layer.weight", hf=("lm_head.weight",),
                  transform=Transform.VOCAB, untied_only=True),
)


@dataclass(frozen=True, kw_only=True)
class Dims:
    """Model dimensions the transforms and shape checks need."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    padded_vocab_size: int
    tied: bool = False

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not a multiple "
                             f"of the number of KV heads {self.num_query_groups}")
        if self.padded_vocab_size < self.vocab_size:
            raise ValueError(f"padded vocabulary {self.padded_vocab_size} < vocabulary "
                             f"{self.vocab_size}")

    def hf_shapes(self, mapping: WeightMapping) -> tuple[tuple[int, ...], ...]:
        """Expected shapes of the HF tensors of ``mapping``."""
        H, d = self.hidden_size, self.head_dim
        t = mapping.transform
        if t is Transform.QKV:
            return ((self.num_attention_heads * d, H), (self.num_query_groups * d, H),
                    (self.num_query_groups * d, H))
        if t is Transform.GATE_UP:
            return ((self.ffn_hidden_size, H), (self.ffn_hidden_size, H))
        if t is Transform.VOCAB:
            return ((self.vocab_size, H),)
        name = mapping.megatron
        if "layernorm" in name:
            return ((H,),)
        if name.endswith("linear_proj.weight"):
            return ((H, self.num_attention_heads * d),)
        if name.endswith("linear_fc2.weight"):
            return ((H, self.ffn_hidden_size),)
        raise KeyError(name)


def expand(mappings: Sequence[WeightMapping], dims: Dims
           ) -> Iterator[tuple[WeightMapping, int | None]]:
    """Every ``(mapping, layer)`` pair of a model (layer ``None`` for non-layer tensors), in
    HF file order: embedding, layer 0..N-1, final norm, output layer."""
    for m in mappings:
        if m.untied_only and dims.tied:
            continue
        if not m.per_layer:
            if m.megatron.startswith("embedding"):
                yield m, None
    for layer in range(dims.num_layers):
        for m in mappings:
            if m.per_layer:
                yield m, layer
    for m in mappings:
        if not m.per_layer and not m.megatron.startswith("embedding"):
            if not (m.untied_only and dims.tied):
                yield m, None


def hf_names(mappings: Sequence[WeightMapping], dims: Dims) -> list[str]:
    """All HF tensor names the model needs."""
    return [n for m, layer in expand(mappings, dims) for n in m.hf_names(layer=layer)]


def to_megatron(mapping: WeightMapping, hf: Sequence[Tensor], dims: Dims) -> Tensor:
    """HF tensor(s) -> the Megatron tensor (see the module docstring for shapes)."""
    t = mapping.transform
    if t is Transform.IDENTITY:
        return hf[0]
    if t is Transform.VOCAB:
        pad = dims.padded_vocab_size - dims.vocab_size
        if pad == 0:
            return hf[0]
        return torch.cat((hf[0], hf[0].new_zeros(pad, hf[0].shape[1])))
    if t is Transform.GATE_UP:
        return torch.cat((hf[0], hf[1]))
    if t is Transform.QKV:
        q, k, v = hf
        ng, d, H = dims.num_query_groups, dims.head_dim, q.shape[-1]
        per_group = dims.num_attention_heads // ng
        fused = torch.cat((q.reshape(ng, per_group * d, H), k.reshape(ng, d, H),
                           v.reshape(ng, d, H)), dim=1)  # [ng, (per_group + 2) * d, H]
        return fused.reshape(-1, H)
    raise ValueError(t)


def to_hf(mapping: WeightMapping, tensor: Tensor, dims: Dims) -> tuple[Tensor, ...]:
    """The Megatron tensor -> HF tensor(s), in ``mapping.hf`` order (contiguous copies)."""
    t = mapping.transform
    if t is Transform.IDENTITY:
        return (tensor.contiguous(),)
    if t is Transform.VOCAB:
        return (tensor[: dims.vocab_size].contiguous(),)
    if t is Transform.GATE_UP:
        gate, up = torch.chunk(tensor, 2, dim=0)
        return gate.contiguous(), up.contiguous()
    if t is Transform.QKV:
        ng, d, H = dims.num_query_groups, dims.head_dim, tensor.shape[-1]
        per_group = dims.num_attention_heads // ng
        grouped = tensor.reshape(ng, (per_group + 2) * d, H)
        q, k, v = torch.split(grouped, [per_group * d, d, d], dim=1)
        return (q.reshape(-1, H).contiguous(), k.reshape(-1, H).contiguous(),
                v.reshape(-1, H).contiguous())
    raise ValueError(t)


def megatron_shape(mapping: WeightMapping, dims: Dims) -> tuple[int, ...]:
    """Shape of the Megatron tensor of ``mapping`` (one layer)."""
    H, d = dims.hidden_size, dims.head_dim
    t = mapping.transform
    if t is Transform.QKV:
        return ((dims.num_attention_heads + 2 * dims.num_query_groups) * d, H)
    if t is Transform.GATE_UP:
        return (2 * dims.ffn_hidden_size, H)
    if t is Transform.VOCAB:
        return (dims.padded_vocab_size, H)
    return dims.hf_shapes(mapping)[0]
