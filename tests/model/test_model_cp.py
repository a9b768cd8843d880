"""Context parallelism: positions zig-zag sliced, then RoPE per rank == full RoPE sliced."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from megatron.core import utils as mcore_utils
from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb

from megatron_endprompt.model import EndPromptRotaryEmbedding, zigzag_indices, zigzag_slice

HEAD_DIM = 64


def positions(batch_layouts: list[tuple[int, int]], target_length: int) -> torch.Tensor:
    """EndPrompt rows: context ``0..a-1`` then terminal ``L-b..L-1`` -> ``[B, a + b]``."""
    return torch.stack(
        [
            torch.cat((torch.arange(a), torch.arange(target_length - b, target_length)))
            for a, b in batch_layouts
        ]
    )


class _FakeGroup:
    """Stands for a CP process group of ``size`` ranks seen from ``rank``."""

    def __init__(self, size: int, rank: int) -> None:
        self.size, self.rank = size, rank


@pytest.mark.parametrize("cp_size", [2, 4])
def test_zigzag_slice_matches_megatron_get_batch(cp_size: int, monkeypatch) -> None:
    """Our helper cuts exactly like Megatron's ``get_batch_on_this_cp_rank`` (no cu_seqlens)."""
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: group.size)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: group.rank)
    pos = positions([(40, 24), (10, 54)], 8192)
    tokens = torch.randint(0, 1000, pos.shape)
    for rank in range(cp_size):
        batch = {"tokens": tokens.clone(), "position_ids": pos.clone(), "cu_seqlens": None}
        sliced = mcore_utils.get_batch_on_this_cp_rank(
            batch, is_hybrid_cp=False, cp_group=_FakeGroup(cp_size, rank)
        )
        for key, full in (("position_ids", pos), ("tokens", tokens)):
            assert torch.equal(sliced[key], zigzag_slice(full, cp_size=cp_size, cp_rank=rank))


def test_zigzag_indices_cover_sequence_once() -> None:
    idx = torch.cat([zigzag_indices(16, cp_size=2, cp_rank=r) for r in range(2)])
    assert idx.tolist() == [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11]
    assert torch.equal(idx.sort().values, torch.arange(16))
    with pytest.raises(ValueError, match="divisible"):
        zigzag_indices(10, cp_size=2, cp_rank=0)


@pytest.mark.parametrize("mixed", [False, True])
def test_rope_per_cp_rank_equals_full_rope_sliced(mixed: bool) -> None:
    cp_size, L = 2, 65536
    layouts = [(40, 24), (10, 54), (63, 1)] if mixed else [(40, 24)] * 3
    pos = positions(layouts, L)  # [B, 64]
    rope = EndPromptRotaryEmbedding(
        kv_channels=HEAD_DIM, pi_factor=8.0, use_cpu_initialization=True
    )
    full = rope(pos)  # [S, 1|B, 1, D]
    assert full.shape[1] == (3 if mixed else 1)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(64, 3, 2, HEAD_DIM, generator=gen)
    q_full = rope_utils_apply(q, full)
    for rank in range(cp_size):
        local_pos = zigzag_slice(pos, cp_size=cp_size, cp_rank=rank)  # [B, S / cp]
        local = rope(local_pos)  # computed from this rank's positions, never re-sliced
        assert torch.equal(local, zigzag_slice(full, cp_size=cp_size, cp_rank=rank, seq_dim=0))
        local_q = zigzag_slice(q, cp_size=cp_size, cp_rank=rank, seq_dim=0)
        assert torch.equal(
            rope_utils_apply(local_q, local),
            zigzag_slice(q_full, cp_size=cp_size, cp_rank=rank, seq_dim=0),
        )


def rope_utils_apply(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Megatron's unfused RoPE on ``t [S, B, H, D]`` with freqs ``[S, 1|B, 1, D]``."""
    config = SimpleNamespace(
        apply_rope_fusion=False,
        rotary_interleaved=False,
        multi_latent_attention=False,
        mrope_section=None,
    )
    return apply_rotary_pos_emb(t, freqs, config, cp_group=object())


class _CPGroup:
    """A CP process group of ``size`` ranks seen from ``rank`` (``size()``/``rank()``, as
    ``torch.distributed.ProcessGroup``)."""

    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


@pytest.mark.parametrize("mixed", [False, True])
def test_model_rope_call_under_cp_uses_the_sliced_positions_once(mixed: bool) -> None:
    """The model's length-only call (``rotary_pos_emb(rotary_seq_len)``, the full length under
    CP) inside ``call_positions`` returns exactly this rank's rows of the full freqs: the
    positions handed in are already zig-zag sliced and are not sliced again (stock
    ``RotaryEmbedding.forward`` slices its table per CP rank)."""
    cp_size, L = 2, 65536
    layouts = [(40, 24), (10, 54), (63, 1)] if mixed else [(40, 24)] * 3
    pos = positions(layouts, L)  # [B, 64]
    full = EndPromptRotaryEmbedding(kv_channels=HEAD_DIM, pi_factor=8.0,
                                    use_cpu_initialization=True)(pos)
    for rank in range(cp_size):
        rope = EndPromptRotaryEmbedding(kv_channels=HEAD_DIM, pi_factor=8.0,
                                        use_cpu_initialization=True,
                                        cp_group=_CPGroup(cp_size, rank))
        local_pos = zigzag_slice(pos, cp_size=cp_size, cp_rank=rank)
        with rope.call_positions(local_pos):
            got = rope(pos.shape[1])  # what GPTModel asks: rotary_seq_len = S_local * CP
        assert torch.equal(got, zigzag_slice(full, cp_size=cp_size, cp_rank=rank, seq_dim=0))
