"""The RoPE router (:mod:`megatron_endprompt.runtime.rope`) against the real Transformer Engine
(``pytest -m te``: the real library's shape checks, not a stand-in). Collected everywhere, run
wherever ``transformer_engine.pytorch`` imports (with or without CUDA), skipped with the import
error otherwise (``tests/conftest.py``).

Checked with TE's own functions: TE's unfused RoPE equals Megatron's for shared ``[S,1,1,D]`` and
per-row ``[S,B,1,D]`` freqs; Megatron's call matches the installed TE's signature; without the
router a mixed batch fails TE's fused-kernel shape check; with it a mixed batch takes Megatron's
unfused path (row by row equal to the reference) and a shared one still goes to TE's fused
kernel, past its shape checks (on a GPU: equal to the reference).
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.te

S, B, H, D, L = 64, 2, 2, 16, 512
SHAPE_CHECK = "second and third dims of the freqs tensor equal 1"  # TE's fused-RoPE check
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _positions(shared: bool) -> torch.Tensor:
    """``[B, S]`` EndPrompt positions: context ``0..S-b-1``, terminal ending at ``L - 1``;
    ``b`` per row (mixed) or the same for all rows (shared)."""
    rows = []
    for r in range(B):
        b = 8 if shared or r % 2 == 0 else 12
        rows.append(torch.cat([torch.arange(S - b), torch.arange(L - b, L)]))
    return torch.stack(rows)


def _freqs(positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Megatron's non-interleaved freqs ``[S, B', 1, D]`` of ``positions [B', S]``."""
    inv = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = positions.double().T[..., None] * inv
    return torch.cat([angles, angles], dim=-1)[:, :, None, :].float().to(DEVICE)


def _config(fusion: bool):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(num_layers=1, hidden_size=H * D, num_attention_heads=H,
                             apply_rope_fusion=fusion)


#: ``apply_rotary_pos_emb``'s ``cp_group`` (read for packed sequences only): no process group
#: needed for the bshd path.
CP = SimpleNamespace(size=lambda: 1, rank=lambda: 0)


@pytest.fixture
def router():
    """The runtime's router installed alone (restored afterwards); the stock fused function."""
    from megatron.core.models.common.embeddings import rope_utils

    from megatron_endprompt.runtime.ledger import Ledger
    from megatron_endprompt.runtime.rope import install_rope_fallback

    stock = rope_utils.fused_apply_rotary_pos_emb
    ledger = Ledger()
    assert install_rope_fallback(ledger), "TE imports: Megatron has a fused RoPE to route around"
    yield stock
    ledger.restore()
    assert rope_utils.fused_apply_rotary_pos_emb is stock


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "mixed"])
def test_te_unfused_rope_equals_megatron(shared):
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd
    from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb as te_rope

    pos = _positions(shared)
    freqs = _freqs(pos[:1] if shared else pos)
    assert freqs.shape == ((S, 1, 1, D) if shared else (S, B, 1, D))
    t = torch.randn(S, B, H, D, device=DEVICE)
    got = te_rope(t, freqs, tensor_format="sbhd", fused=False)
    torch.testing.assert_close(got, _apply_rotary_pos_emb_bshd(t, freqs, rotary_interleaved=False),
                               rtol=1e-6, atol=1e-6)


def test_megatron_calls_match_te_signature():
    """rope_utils calls ``fused_apply_rotary_pos_emb(t, freqs, interleaved=...)``; Megatron's TE
    wrapper calls TE's ``apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", interleaved=...,
    fused=True)`` (TE >= 2.3)."""
    from megatron.core.extensions import transformer_engine as mte
    from megatron.core.models.common.embeddings import rope_utils
    from transformer_engine.pytorch.attention import rope as te

    assert rope_utils.fused_apply_rotary_pos_emb is mte.fused_apply_rotary_pos_emb
    assert mte.apply_rotary_pos_emb is te.apply_rotary_pos_emb
    t, freqs = torch.zeros(S, B, H, D), torch.zeros(S, 1, 1, D)
    inspect.signature(mte.fused_apply_rotary_pos_emb).bind(t, freqs, interleaved=False)
    inspect.signature(te.apply_rotary_pos_emb).bind(t, freqs, tensor_format="sbhd",
                                                    interleaved=False, fused=True)


def test_mixed_batch_fails_te_shape_check_without_router():
    """Why the router exists: TE's fused kernel takes only ``[S, 1, 1, D]`` freqs."""
    from megatron.core.models.common.embeddings import rope_utils

    t = torch.randn(S, B, H, D, device=DEVICE)
    with pytest.raises(Exception, match=SHAPE_CHECK):
        rope_utils.apply_rotary_pos_emb(t, _freqs(_positions(shared=False)),
                                        config=_config(True), cp_group=CP)


def test_router_sends_mixed_rows_unfused_and_shared_to_te(router, monkeypatch):
    from megatron.core.extensions import transformer_engine as mte
    from megatron.core.models.common.embeddings import rope_utils

    calls = []
    real = mte.apply_rotary_pos_emb

    def spy(t, freqs, *args, **kwargs):  # TE's function, recording what reaches it
        calls.append((tuple(freqs.shape), kwargs.get("fused")))
        return real(t, freqs, *args, **kwargs)

    monkeypatch.setattr(mte, "apply_rotary_pos_emb", spy)
    t = torch.randn(S, B, H, D, device=DEVICE)
    mixed = _positions(shared=False)
    got = rope_utils.apply_rotary_pos_emb(t, _freqs(mixed), config=_config(True), cp_group=CP)
    assert calls == [], "a mixed batch never reaches TE's fused kernel"
    for r in range(B):
        ref = rope_utils.apply_rotary_pos_emb(t[:, r:r + 1], _freqs(mixed[r:r + 1]),
                                              config=_config(False), cp_group=CP)
        torch.testing.assert_close(got[:, r:r + 1], ref, rtol=1e-6, atol=1e-6)

    shared = _freqs(_positions(shared=True)[:1])
    try:
        fused = rope_utils.apply_rotary_pos_emb(t, shared, config=_config(True), cp_group=CP)
    except Exception as exc:  # noqa: BLE001 - without CUDA the kernel itself cannot run
        assert DEVICE == "cpu" and SHAPE_CHECK not in str(exc), exc
    else:
        ref = rope_utils.apply_rotary_pos_emb(t, shared, config=_config(False), cp_group=CP)
        torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-5)
    assert calls == [((S, 1, 1, D), True)], "a shared batch goes to TE's fused kernel"
