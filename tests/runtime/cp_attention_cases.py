"""The context-parallel attention cases shared by the in-process test and the gloo worker: the
modules, the unsharded reference and the per-rank comparison."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_endprompt.model.cp import zigzag_slice
from megatron_endprompt.runtime.cp_attention import CPUContextParallelAttention

#: (CP, batch, query heads, KV groups, head dim, sequence length): GQA and batch > 1 throughout.
CASES = [(2, 2, 4, 2, 8, 16), (4, 3, 4, 1, 8, 32)]


def attention(cp: int, heads: int, groups: int, dim: int, pg_collection: Any = None):
    """A CPU context-parallel core attention of CP ``cp`` (causal, fp32, no dropout)."""
    config = TransformerConfig(num_layers=1, hidden_size=heads * dim, kv_channels=dim,
                               num_attention_heads=heads, num_query_groups=groups,
                               attention_dropout=0.0, hidden_dropout=0.0,
                               context_parallel_size=cp, masked_softmax_fusion=False)
    return CPUContextParallelAttention(config, 1, AttnMaskType.causal, "self",
                                       pg_collection=pg_collection)


def inputs(batch: int, heads: int, groups: int, dim: int, seq: int, seed: int = 0):
    """Full-sequence ``q [S, B, H, D]``, ``k``, ``v [S, B, G, D]`` and an output weight
    ``[S, B, H * D]`` (the loss is ``sum(out * weight)``, so every output row has its own
    gradient)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(seq, batch, heads, dim, generator=g)
    k = torch.randn(seq, batch, groups, dim, generator=g)
    v = torch.randn(seq, batch, groups, dim, generator=g)
    w = torch.randn(seq, batch, heads * dim, generator=g)
    return q, k, v, w


def reference(q, k, v, w, heads: int, groups: int, dim: int):
    """Unsharded stock attention (CP == 1): output and the gradients of q, k, v. The causal
    mask is given (stock builds its default one on ``"cuda"``)."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    seq = q.shape[0]
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)[None, None]
    out = attention(1, heads, groups, dim)(*leaves, causal)
    (out * w).sum().backward()
    return SimpleNamespace(out=out.detach(), dq=leaves[0].grad, dk=leaves[1].grad,
                           dv=leaves[2].grad)


def rank_slice(t, cp: int, rank: int):
    """CP rank ``rank``'s zig-zag part of a ``[S, ...]`` tensor."""
    return zigzag_slice(t, cp_size=cp, cp_rank=rank, seq_dim=0)


def assert_close(got, want, what: str) -> None:
    """fp32, 1e-5 absolute and relative: a CP rank attends over the same keys in the same
    global order as the unsharded attention; only the batched matmuls' shapes differ."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")
