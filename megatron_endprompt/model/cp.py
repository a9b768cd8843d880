"""Megatron's zig-zag context-parallel split of the sequence dimension.

Megatron-Core (``utils.get_batch_on_this_cp_rank``, per-sequence balancing) cuts the sequence into
``2 * cp_size`` equal chunks and gives CP rank ``r`` chunks ``r`` and ``2 * cp_size - 1 - r``, so
every rank gets as much causal-attention work as the others. Position ids must be cut the same
way as the tokens; this helper does it for one tensor.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["zigzag_indices", "zigzag_slice"]


def zigzag_indices(seq_len: int, *, cp_size: int, cp_rank: int) -> Tensor:
    """Sequence indices ``[seq_len // cp_size]`` that CP rank ``cp_rank`` holds."""
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank={cp_rank} outside [0, {cp_size})")
    if seq_len % (2 * cp_size):
        raise ValueError(f"sequence length {seq_len} not divisible by 2 * cp_size = {2 * cp_size}")
    chunk = seq_len // (2 * cp_size)
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    second_start = (2 * cp_size - 1 - cp_rank) * chunk
    return torch.cat((first, torch.arange(second_start, second_start + chunk)))


def zigzag_slice(t: Tensor, *, cp_size: int, cp_rank: int, seq_dim: int = 1) -> Tensor:
    """This CP rank's zig-zag part of ``t`` along ``seq_dim``.

    ``t`` e.g. ``position_ids [B, S]`` (``seq_dim=1``) -> ``[B, S / cp_size]``, or freqs
    ``[S, B, 1, D]`` (``seq_dim=0``) -> ``[S / cp_size, B, 1, D]``. ``cp_size == 1`` returns
    ``t`` unchanged.
    """
    if cp_size == 1:
        return t
    idx = zigzag_indices(t.shape[seq_dim], cp_size=cp_size, cp_rank=cp_rank).to(t.device)
    return t.index_select(seq_dim, idx)
