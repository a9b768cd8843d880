"""HF <-> Megatron tensor transforms: one small class per transform, each knowing its shapes and
both directions (the role of Megatron-Bridge's ``QKVMapping`` / ``GatedMLPMapping``).

Shapes use ``H`` hidden, ``d`` head dim, ``nh`` query heads, ``ng`` query groups (= KV heads),
``F`` FFN size, ``V`` vocabulary, ``Vp`` padded vocabulary. Every transform is exactly invertible
(``to_hf(to_megatron(x)) == x`` bit for bit; rows appended by :class:`VocabPad` are zeros that
:meth:`VocabPad.to_hf` drops), so a round trip through Megatron returns the HF tensors unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from megatron_endprompt.shape import ModelShape

__all__ = ["Dims", "GateUpConcat", "HeadNorm", "Identity", "Norm", "QKVBiasFusedPerGroup",
           "QKVFusedPerGroup", "Transform", "VocabPad"]

Shape = tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Dims(ModelShape):
    """Model dimensions the transforms need: the shape plus Megatron's padded vocabulary."""

    padded_vocab_size: int
    """``Vp >= V``: Megatron's embedding rows (padded for TP)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.padded_vocab_size < self.vocab_size:
            raise ValueError(f"padded vocabulary {self.padded_vocab_size} < vocabulary "
                             f"{self.vocab_size}")


class Transform(ABC):
    """HF tensor(s) <-> one Megatron tensor, in the order the mapping lists the HF names."""

    @abstractmethod
    def hf_shapes(self, dims: Dims) -> tuple[Shape, ...]:
        """Shapes of the HF tensors."""

    @abstractmethod
    def megatron_shape(self, dims: Dims) -> Shape:
        """Shape of the Megatron tensor (one layer)."""

    @abstractmethod
    def to_megatron(self, hf: Sequence[Tensor], dims: Dims) -> Tensor:
        """HF tensors -> the Megatron tensor."""

    @abstractmethod
    def to_hf(self, tensor: Tensor, dims: Dims) -> tuple[Tensor, ...]:
        """The Megatron tensor -> HF tensors (contiguous copies)."""


@dataclass(frozen=True)
class Identity(Transform):
    """Same tensor both ways; ``shape`` names the :class:`Dims` attributes of its dimensions
    (``o_proj``: ``("hidden_size", "query_width")`` = ``[H, nh*d]``; ``down_proj``:
    ``("hidden_size", "ffn_hidden_size")`` = ``[H, F]``)."""

    shape: tuple[str, ...]
    """:class:`Dims` attribute per dimension."""

    def megatron_shape(self, dims: Dims) -> Shape:
        return tuple(getattr(dims, f) for f in self.shape)

    def hf_shapes(self, dims: Dims) -> tuple[Shape, ...]:
        return (self.megatron_shape(dims),)

    def to_megatron(self, hf: Sequence[Tensor], dims: Dims) -> Tensor:
        return hf[0]

    def to_hf(self, tensor: Tensor, dims: Dims) -> tuple[Tensor, ...]:
        return (tensor.contiguous(),)


class Norm(Identity):
    """An RMSNorm weight ``[H]``, unchanged."""

    def __init__(self) -> None:
        super().__init__(("hidden_size",))


class HeadNorm(Identity):
    """A per-head RMSNorm weight ``[d]``, unchanged: Qwen3's ``q_norm`` / ``k_norm`` <->
    Megatron ``q_layernorm`` / ``k_layernorm`` (``--qk-layernorm``; both normalise each head's
    ``d`` channels after the projection, before RoPE)."""

    def __init__(self) -> None:
        super().__init__(("head_dim",))


class QKVFusedPerGroup(Transform):
    """HF ``q [nh*d, H]``, ``k [ng*d, H]``, ``v [ng*d, H]`` <-> Megatron ``linear_qkv
    [(nh + 2*ng)*d, H]`` fused per query group: ``[q heads of group g, k_g, v_g]`` for
    ``g = 0..ng-1`` (the layout Megatron's attention splits, and the one tensor parallelism
    shards by whole groups, so a checkpoint's global tensor is the same at every TP)."""

    def hf_shapes(self, dims: Dims) -> tuple[Shape, ...]:
        H, d = dims.hidden_size, dims.head_dim
        return ((dims.num_attention_heads * d, H), (dims.num_query_groups * d, H),
                (dims.num_query_groups * d, H))

    def megatron_shape(self, dims: Dims) -> Shape:
        return ((dims.num_attention_heads + 2 * dims.num_query_groups) * dims.head_dim,
                dims.hidden_size)

    def to_megatron(self, hf: Sequence[Tensor], dims: Dims) -> Tensor:
        q, k, v = hf
        ng, d, rest = dims.num_query_groups, dims.head_dim, tuple(q.shape[1:])
        fused = torch.cat((q.reshape(ng, dims.heads_per_group * d, *rest),
                           k.reshape(ng, d, *rest), v.reshape(ng, d, *rest)),
                          dim=1)  # [ng, (nh/ng + 2) * d, *rest]
        return fused.reshape(-1, *rest)

    def to_hf(self, tensor: Tensor, dims: Dims) -> tuple[Tensor, ...]:
        ng, d, rest = dims.num_query_groups, dims.head_dim, tuple(tensor.shape[1:])
        grouped = tensor.reshape(ng, (dims.heads_per_group + 2) * d, *rest)
        q, k, v = torch.split(grouped, [dims.heads_per_group * d, d, d], dim=1)
        return (q.reshape(-1, *rest).contiguous(), k.reshape(-1, *rest).contiguous(),
                v.reshape(-1, *rest).contiguous())


class QKVBiasFusedPerGroup(QKVFusedPerGroup):
    """Qwen2's biases: HF ``q_proj.bias [nh*d]``, ``k_proj.bias [ng*d]``, ``v_proj.bias
    [ng*d]`` <-> Megatron ``linear_qkv.bias [(nh + 2*ng)*d]`` (``--add-qkv-bias``), fused per
    query group exactly like the weight's rows (the bias is added to those rows)."""

    def hf_shapes(self, dims: Dims) -> tuple[Shape, ...]:
        return tuple(s[:1] for s in super().hf_shapes(dims))

    def megatron_shape(self, dims: Dims) -> Shape:
        return super().megatron_shape(dims)[:1]


class GateUpConcat(Transform):
    """HF ``gate [F, H]``, ``up [F, H]`` <-> ``linear_fc1 [2F, H] = cat(gate, up)`` (the global
    layout of a SwiGLU ``linear_fc1`` in a ``torch_dist`` checkpoint at any TP)."""

    def hf_shapes(self, dims: Dims) -> tuple[Shape, ...]:
        return ((dims.ffn_hidden_size, dims.hidden_size),) * 2

    def megatron_shape(self, dims: Dims) -> Shape:
        return (2 * dims.ffn_hidden_size, dims.hidden_size)

    def to_megatron(self, hf: Sequence[Tensor], dims: Dims) -> Tensor:
        return torch.cat((hf[0], hf[1]))

    def to_hf(self, tensor: Tensor, dims: Dims) -> tuple[Tensor, ...]:
        gate, up = torch.chunk(tensor, 2, dim=0)
        return gate.contiguous(), up.contiguous()


class VocabPad(Transform):
    """HF ``[V, H]`` <-> Megatron ``[Vp, H]``: zero rows appended on the way in, removed on the
    way out (embedding and output layer)."""

    def hf_shapes(self, dims: Dims) -> tuple[Shape, ...]:
        return ((dims.vocab_size, dims.hidden_size),)

    def megatron_shape(self, dims: Dims) -> Shape:
        return (dims.padded_vocab_size, dims.hidden_size)

    def to_megatron(self, hf: Sequence[Tensor], dims: Dims) -> Tensor:
        pad = dims.padded_vocab_size - dims.vocab_size
        if pad == 0:
            return hf[0]
        return torch.cat((hf[0], hf[0].new_zeros(pad, hf[0].shape[1])))

    def to_hf(self, tensor: Tensor, dims: Dims) -> tuple[Tensor, ...]:
        return (tensor[: dims.vocab_size].contiguous(),)
