"""EndPrompt RoPE: Hugging Face parity, freqs shapes, per-row application, stock layout."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply_rope

from megatron_endprompt.model import EndPromptRotaryEmbedding, resolve_pi_factor
from tests.support.hf_configs import rope_config

HEAD_DIM = 128
BASE = 500000.0
TOL = 1e-5


def endprompt_positions(a: int, b: int, target_length: int) -> torch.Tensor:
    """Context ``0..a-1`` then terminal ``L-b..L-1``: ``[a + b]`` int64."""
    return torch.cat((torch.arange(a), torch.arange(target_length - b, target_length)))


def unfused_config(*, interleaved: bool = False, fusion: bool = False) -> SimpleNamespace:
    """The TransformerConfig fields ``rope_utils.apply_rotary_pos_emb`` reads."""
    return SimpleNamespace(
        apply_rope_fusion=fusion,
        rotary_interleaved=interleaved,
        multi_latent_attention=False,
        mrope_section=None,
    )


def megatron_apply(t_sbhd: torch.Tensor, freqs: torch.Tensor, **cfg) -> torch.Tensor:
    # cp_group only matters for packed (thd) input; any non-None value skips Megatron's lookup.
    return apply_rotary_pos_emb(t_sbhd, freqs, unfused_config(**cfg), cp_group=object())


def hf_rope(rope_parameters: dict, max_pos: int = 131072) -> LlamaRotaryEmbedding:
    return LlamaRotaryEmbedding(rope_config(
        head_dim=HEAD_DIM, max_position_embeddings=max_pos,
        rope_parameters={"rope_theta": BASE, **rope_parameters}))


def ours(**kwargs) -> EndPromptRotaryEmbedding:
    return EndPromptRotaryEmbedding(
        kv_channels=HEAD_DIM, rotary_base=int(BASE), use_cpu_initialization=True, **kwargs
    )


@pytest.mark.parametrize("s", [8.0, 2.5])
@pytest.mark.parametrize("mixed", [False, True])
def test_matches_hf_linear_scaling(s: float, mixed: bool) -> None:
    L = 65536
    layouts = [(200, 56), (120, 136), (255, 1)] if mixed else [(200, 56)] * 3
    position_ids = torch.stack([endprompt_positions(a, b, L) for a, b in layouts])  # [B, S]
    B, S = position_ids.shape

    freqs = ours(pi_factor=s)(position_ids)
    assert freqs.shape == ((S, B, 1, HEAD_DIM) if mixed else (S, 1, 1, HEAD_DIM))

    hf = hf_rope({"rope_type": "linear", "factor": s})
    x = torch.zeros(1, dtype=torch.float32)
    cos_hf, sin_hf = hf(x, position_ids)  # [B, S, D]
    freqs_bsd = freqs[:, :, 0, :].transpose(0, 1).expand(B, S, HEAD_DIM)
    assert (freqs_bsd.cos() - cos_hf).abs().max() <= TOL
    assert (freqs_bsd.sin() - sin_hf).abs().max() <= TOL

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(S, B, 4, HEAD_DIM, generator=gen)
    k = torch.randn(S, B, 2, HEAD_DIM, generator=gen)
    q_ours, k_ours = megatron_apply(q, freqs), megatron_apply(k, freqs)
    q_hf, k_hf = hf_apply_rope(q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), cos_hf, sin_hf)
    assert (q_ours - q_hf.permute(2, 0, 1, 3)).abs().max() <= TOL
    assert (k_ours - k_hf.permute(2, 0, 1, 3)).abs().max() <= TOL


def test_llama3_scaling_with_pi_matches_hf_llama3_at_divided_positions() -> None:
    """Megatron's ``rope_scaling`` (Llama-3.1: factor 8, low 1, high 4, original 8192) under
    EndPrompt PI equals HF ``llama3`` RoPE at ``positions / s``."""
    s, L = 2.0, 32768
    position_ids = endprompt_positions(100, 28, L)[None]
    rope = ours(pi_factor=s, rope_scaling=True, rope_scaling_factor=8.0)
    hf = hf_rope(
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    )
    assert torch.equal(rope.inv_freq, hf.inv_freq)
    cos_hf, sin_hf = hf(torch.zeros(1), position_ids.float() / s)
    freqs = rope(position_ids)[:, 0, 0, :]
    assert (freqs.cos() - cos_hf[0]).abs().max() <= TOL
    assert (freqs.sin() - sin_hf[0]).abs().max() <= TOL


@pytest.mark.parametrize("interleaved", [False, True])
def test_batched_freqs_equal_per_row_application(interleaved: bool) -> None:
    rope = ours(pi_factor=4.0, rotary_interleaved=interleaved)
    L = 4096
    shared = torch.stack([endprompt_positions(48, 16, L)] * 3)
    mixed = torch.stack([endprompt_positions(a, 64 - a, L) for a in (48, 10, 63)])
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(64, 3, 4, HEAD_DIM, generator=gen)
    for position_ids, width in ((shared, 1), (mixed, 3)):
        freqs = rope(position_ids)
        assert freqs.shape == (64, width, 1, HEAD_DIM)
        out = megatron_apply(q, freqs, interleaved=interleaved)
        for b in range(3):
            row = rope(position_ids[b : b + 1])
            assert row.shape == (64, 1, 1, HEAD_DIM)
            expected = megatron_apply(q[:, b : b + 1], row, interleaved=interleaved)
            assert torch.equal(out[:, b : b + 1], expected)


@pytest.mark.parametrize("interleaved", [False, True])
def test_contiguous_positions_equal_stock_layout(interleaved: bool, cpu_forward) -> None:
    """Positions ``0..S-1``, s=1 -> exactly stock ``get_emb`` (also the float-position path)."""
    rope = ours(rotary_interleaved=interleaved)
    stock = rope.get_emb(96)
    assert torch.equal(rope(torch.arange(96)[None].repeat(2, 1)), stock)
    assert torch.equal(rope(torch.arange(96, dtype=torch.float32)), stock)


def test_pi_factor_resolution() -> None:
    assert resolve_pi_factor(None, None) == 1.0
    assert resolve_pi_factor(None, 4.0) == 4.0
    assert resolve_pi_factor(2.5, None) == 2.5
    assert resolve_pi_factor(8, 8.0) == 8.0
    with pytest.raises(ValueError, match="disagrees"):
        resolve_pi_factor(8.0, 4.0)
    with pytest.raises(ValueError, match=">= 1"):
        resolve_pi_factor(0.5, None)
    assert ours(pi_factor=1.0).seq_len_interpolation_factor is None
    assert ours(pi_factor=3.0).seq_len_interpolation_factor == 3.0


def test_fused_path_falls_back_for_per_row_freqs(monkeypatch) -> None:
    """With ``apply_rope_fusion`` and the runtime's router, ``[S, 1, 1, D]`` still reaches the
    fused kernel, while ``[S, B, 1, D]`` takes Megatron's unfused path. (The fake kernel stands
    in for TE's, absent on CPU; the router is installed and restored through a ledger.)"""
    from megatron_endprompt.runtime.ledger import Ledger
    from megatron_endprompt.runtime.rope import install_rope_fallback

    calls = []

    def fake_fused(t, freqs, transpose_output_memory=False, interleaved=False):
        assert freqs.shape[1] == 1, "fused RoPE got per-row freqs"
        calls.append(freqs.shape)
        return rope_utils._apply_rotary_pos_emb_bshd(t, freqs, rotary_interleaved=interleaved)

    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", fake_fused)
    ledger = Ledger()
    assert install_rope_fallback(ledger)
    try:
        rope = ours(pi_factor=2.0)
        mixed = torch.stack([endprompt_positions(a, 32 - a, 1024) for a in (8, 20)])
        q = torch.randn(32, 2, 2, HEAD_DIM)
        fused_out = megatron_apply(q, rope(mixed), fusion=True)
        assert calls == []
        assert torch.equal(fused_out, megatron_apply(q, rope(mixed)))
        megatron_apply(q, rope(mixed[:1].repeat(2, 1)), fusion=True)
        assert calls == [torch.Size([32, 1, 1, HEAD_DIM])]
    finally:
        assert ledger.restore() == 1
    assert rope_utils.fused_apply_rotary_pos_emb is fake_fused
