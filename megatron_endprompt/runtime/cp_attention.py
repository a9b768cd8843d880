"""Context-parallel core attention for the CPU runtime (Megatron's local attention, CP > 1).

Megatron-Core runs context parallelism only inside Transformer Engine's attention (ring
attention, CUDA only); its local ``DotProductAttention`` asserts ``context_parallel_size == 1``.
:class:`CPUContextParallelAttention` is that local attention with CP: every CP rank holds the
zig-zag chunks ``r`` and ``2 * CP - 1 - r`` of the sequence (Megatron's
``get_batch_on_this_cp_rank``, :mod:`megatron_endprompt.model.cp`), gathers the keys and values
of the whole sequence across the CP group, puts them back in global token order, and attends with
its own queries under the causal mask of their *global* indices. The result per rank is exactly
the rows of unsharded attention it holds; gradients are exact too: the gather is an autograd
function whose backward reduce-scatters (sums) the key/value gradients of every rank's queries
back onto the rank that owns those tokens. It is not a ring (the full ``[S, B, G, D]`` keys and
values sit on every rank), so it proves correctness, not memory: that is TE's job on a GPU.

Installed by the CPU layer only (:func:`install_cp_attention`): Megatron's local spec provider
(``LocalSpecProvider.core_attention``) hands out this class, which is the stock attention when
CP == 1 (same code path, same numbers).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.models.backends import LocalSpecProvider
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from torch import Tensor

from megatron_endprompt.model.cp import zigzag_indices
from megatron_endprompt.runtime.ledger import Ledger

__all__ = ["CPUContextParallelAttention", "causal_cp_mask", "gather_sequence", "global_order",
           "install_cp_attention"]

_PATCH = "cpu-cp-attention"

#: Fingerprints of what the patch relies on, identical in Megatron-Core 0.18.2, 0.19.x and
#: main 0.20.0 (d98e8a64): the provider method it replaces, and the stock attention's
#: ``__init__`` (the CP assertion is its only CP code) and ``forward`` (takes ``sq != sk`` and an
#: explicit mask, which replaces its own causal one).
FINGERPRINTS: dict[str, dict[str, str]] = {
    "core_attention": {"0.18.2, 0.19.2, 0.20.0": "4bfcfbd6b829"},
    "__init__": {"0.18.2, 0.19.2, 0.20.0": "2f1a9a16c628"},
    "forward": {"0.18.2, 0.19.2, 0.20.0": "484dc8eaff7a"},
}


def global_order(seq_len: int, cp_size: int) -> Tensor:
    """Indices ``[seq_len]`` that put an all-gather of the CP ranks' zig-zag parts (rank 0's
    part, then rank 1's, ...) back in global token order: ``gathered[global_order(...)]``."""
    gathered = torch.cat([zigzag_indices(seq_len, cp_size=cp_size, cp_rank=r)
                          for r in range(cp_size)])
    return torch.argsort(gathered)


def causal_cp_mask(seq_len: int, cp_size: int, cp_rank: int,
                   device: torch.device | None = None) -> Tensor:
    """Causal mask of CP rank ``cp_rank``'s queries over the whole sequence's keys in global
    order: bool ``[1, 1, seq_len / cp_size, seq_len]``, True = masked (Megatron's convention),
    i.e. key index > the query's global index."""
    queries = zigzag_indices(seq_len, cp_size=cp_size, cp_rank=cp_rank).to(device)
    keys = torch.arange(seq_len, device=device)
    return (keys[None, :] > queries[:, None])[None, None]


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 0 over ``group`` (forward); sum-reduce-scatter of the gradient back
    to each rank's own rows (backward): every rank's queries contribute to every key's grad."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        size = torch.distributed.get_world_size(group)
        out = x.new_empty((size * x.shape[0], *x.shape[1:]))
        torch.distributed.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        size = torch.distributed.get_world_size(ctx.group)
        out = grad.new_empty((grad.shape[0] // size, *grad.shape[1:]))
        torch.distributed.reduce_scatter_tensor(out, grad.contiguous(),
                                                op=torch.distributed.ReduceOp.SUM,
                                                group=ctx.group)
        return out, None


def gather_sequence(x: Tensor, group: Any) -> Tensor:
    """This CP rank's zig-zag part ``x [S / CP, ...]`` -> the whole sequence ``[S, ...]`` in
    global token order, on every rank of ``group``; differentiable (exact gradients)."""
    cp = torch.distributed.get_world_size(group)
    gathered = _GatherSequence.apply(x, group)
    return gathered.index_select(0, global_order(gathered.shape[0], cp).to(x.device))


class CPUContextParallelAttention(DotProductAttention):
    """Megatron's local ``DotProductAttention`` that also runs under context parallelism.

    Shapes as stock: query ``[S/CP, B, H, D]``, key/value ``[S/CP, B, G, D]`` (this rank's
    zig-zag part; GQA ``G <= H``) -> context ``[S/CP, B, H * D]``. Under CP the keys and values
    are gathered (:func:`gather_sequence`) before stock's GQA expansion, so only ``G`` heads
    travel, and the mask is :func:`causal_cp_mask` (or the dataloader's mask, whose rows
    Megatron's ``get_batch_on_this_cp_rank`` sliced and whose key columns are global).
    """

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        cp = config.context_parallel_size
        stock = copy.copy(config)  # the stock constructor asserts CP == 1; nothing else is CP
        stock.context_parallel_size = 1
        super().__init__(stock, *args, **kwargs)
        self.config = config
        self.cp_group = None
        if cp > 1:
            if self.scale_mask_softmax.window_size is not None:
                raise ValueError("the CPU context-parallel attention has no sliding-window mask; "
                                 "run --window-size without context parallelism")
            self.cp_group = (getattr(self.pg_collection, "cp", None)
                             or parallel_state.get_context_parallel_group())

    def attend_gathered(self, query: Tensor, key: Tensor, value: Tensor,
                        attention_mask: Tensor | None, *, cp_size: int, cp_rank: int,
                        attn_mask_type: AttnMaskType | None = None) -> Tensor:
        """Stock attention of this rank's queries ``[S/CP, B, H, D]`` over the whole sequence's
        keys/values ``[S, B, G, D]`` (global order). ``attention_mask`` ``None``: the causal mask
        of the queries' global indices (a causal layer), or no mask."""
        if attention_mask is None and self.attn_mask_type == AttnMaskType.causal:
            attention_mask = causal_cp_mask(key.shape[0], cp_size, cp_rank, device=query.device)
        return super().forward(query, key, value, attention_mask, attn_mask_type=attn_mask_type)

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                attention_mask: Tensor | None, attn_mask_type: AttnMaskType | None = None,
                attention_bias: Tensor | None = None, packed_seq_params: Any = None) -> Tensor:
        if self.cp_group is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type,
                                   attention_bias, packed_seq_params)
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("the CPU context-parallel attention takes neither packed "
                                      "sequences nor an attention bias")
        if key.shape[0] != query.shape[0]:
            raise ValueError(f"context-parallel self-attention wants as many keys as queries "
                             f"per rank (got {key.shape[0]} and {query.shape[0]})")
        return self.attend_gathered(
            query, gather_sequence(key, self.cp_group), gather_sequence(value, self.cp_group),
            attention_mask, cp_size=torch.distributed.get_world_size(self.cp_group),
            cp_rank=torch.distributed.get_rank(self.cp_group), attn_mask_type=attn_mask_type)


def install_cp_attention(ledger: Ledger) -> None:
    """Make Megatron's local layer spec use :class:`CPUContextParallelAttention` (the stock
    attention when CP == 1), after checking the stock code it builds on."""
    for name in ("__init__", "forward"):
        ledger.check(DotProductAttention, name, FINGERPRINTS[name], patch=_PATCH)

    def core_attention(self: Any) -> type:
        """Which module to use for attention (the CPU runtime's: CP-capable)."""
        return CPUContextParallelAttention

    ledger.replace(LocalSpecProvider, "core_attention", core_attention, patch=_PATCH,
                   expected=FINGERPRINTS["core_attention"])
