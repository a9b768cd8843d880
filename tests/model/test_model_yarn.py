"""YaRN / NTK-by-parts RoPE with EndPrompt positions, bit-compared with Hugging Face's
``rope_type="yarn"`` (``transformers.modeling_rope_utils``) on a batch whose rows have different
jumped layouts; the attention factor as Megatron's attention applies it."""

from __future__ import annotations

import pytest
import torch
from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding
from test_model_rope import endprompt_positions, unfused_config
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply_rope

from megatron_endprompt.model import EndPromptRotaryEmbedding, YarnScaling
from megatron_endprompt.model.yarn import yarn_from_megatron_args
from tests.support.hf_configs import rope_config

HEAD_DIM, L0 = 128, 4096


def hf_yarn(base: float, factor: float, L: int, **extra) -> LlamaRotaryEmbedding:
    return LlamaRotaryEmbedding(rope_config(
        head_dim=HEAD_DIM, max_position_embeddings=L,
        rope_parameters={"rope_type": "yarn", "rope_theta": base, "factor": factor,
                         "original_max_position_embeddings": L0, **extra}))


def mixed_positions(L: int) -> torch.Tensor:
    """``[3, 256]``: three different EndPrompt layouts (context a, terminal ending at L-1)."""
    return torch.stack([endprompt_positions(a, 256 - a, L) for a in (200, 120, 255)])


CASES = [  # (base, factor, L, HF extra, ours)
    (500000.0, 8.0, 8 * L0, {}, {}),
    (1000000.0, 4.0, 4 * L0, {"beta_fast": 16, "beta_slow": 2}, {"beta_fast": 16.0,
                                                                   "beta_slow": 2.0}),
    (10000.0, 16.0, 16 * L0, {"truncate": False}, {"truncate": False}),
    (500000.0, 8.0, 8 * L0, {"attention_factor": 1.0}, {"attention_scaling": False}),
]


@pytest.mark.parametrize("base, factor, L, hf_extra, extra", CASES)
def test_freqs_cos_sin_bit_equal_hf_on_mixed_layouts(base, factor, L, hf_extra, extra):
    yarn = YarnScaling(factor=factor, original_max_position_embeddings=L0, **extra)
    rope = EndPromptRotaryEmbedding(kv_channels=HEAD_DIM, rotary_base=int(base),
                                    use_cpu_initialization=True, yarn=yarn)
    hf = hf_yarn(base, factor, L, **hf_extra)
    assert torch.equal(rope.inv_freq, hf.inv_freq)
    assert rope.attention_factor == hf.attention_scaling
    position_ids = mixed_positions(L)
    B, S = position_ids.shape
    freqs = rope(position_ids)  # [S, B, 1, D]: rows differ
    assert freqs.shape == (S, B, 1, HEAD_DIM)
    cos_hf, sin_hf = hf(torch.zeros(1), position_ids)  # [B, S, D], factor applied
    angles = freqs[:, :, 0].transpose(0, 1)
    assert torch.equal(angles.cos() * rope.attention_factor, cos_hf)
    assert torch.equal(angles.sin() * rope.attention_factor, sin_hf)
    # q/k rotated by Megatron's kernel with the factor as mscale == HF's rotation
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(S, B, 4, HEAD_DIM, generator=gen)
    k = torch.randn(S, B, 2, HEAD_DIM, generator=gen)
    mg = [apply_rotary_pos_emb(t, freqs, unfused_config(), cp_group=object(),
                               mscale=rope.attention_factor) for t in (q, k)]
    q_hf, k_hf = hf_apply_rope(q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), cos_hf, sin_hf)
    assert torch.equal(mg[0], q_hf.permute(2, 0, 1, 3))
    assert torch.equal(mg[1], k_hf.permute(2, 0, 1, 3))


def test_yarn_differs_from_linear_pi_and_keeps_high_frequencies():
    """YaRN is not PI: the fastest pairs keep their frequency, the slowest are divided by s."""
    yarn = YarnScaling(factor=8.0, original_max_position_embeddings=L0)
    rope = EndPromptRotaryEmbedding(kv_channels=HEAD_DIM, rotary_base=500000,
                                    use_cpu_initialization=True, yarn=yarn)
    plain = EndPromptRotaryEmbedding(kv_channels=HEAD_DIM, rotary_base=500000,
                                     use_cpu_initialization=True)
    assert torch.equal(rope.inv_freq[:8], plain.inv_freq[:8])
    assert torch.equal(rope.inv_freq[-8:], plain.inv_freq[-8:] / 8.0)
    assert rope.attention_factor == pytest.approx(0.1 * torch.log(torch.tensor(8.0)).item() + 1)


def test_megatron_yarn_module_agrees_on_contiguous_positions(cpu_forward):
    """Megatron's own ``YarnRotaryEmbedding`` (contiguous positions only) gives the same angles
    and the same concentration factor as ours at positions ``0..S-1``."""
    yarn = YarnScaling(factor=8.0, original_max_position_embeddings=L0)
    ours = EndPromptRotaryEmbedding(kv_channels=HEAD_DIM, rotary_base=500000,
                                    use_cpu_initialization=True, yarn=yarn)
    stock = YarnRotaryEmbedding(kv_channels=HEAD_DIM, rotary_base=500000,
                                use_cpu_initialization=True, scaling_factor=8.0,
                                original_max_position_embeddings=L0, mscale=None,
                                mscale_all_dim=None)
    emb, mscale = stock.get_emb(64)
    assert torch.equal(ours(torch.arange(64)[None]), emb)
    assert mscale == ours.attention_factor


@pytest.mark.parametrize("kwargs, match", [
    ({"pi_factor": 2.0}, "pi_factor must be 1"),
    ({"rope_scaling": True}, "Llama-3.1"),
    ({"rotary_interleaved": True}, "non-interleaved"),
])
def test_yarn_refuses_what_it_replaces(kwargs, match):
    yarn = YarnScaling(factor=4.0, original_max_position_embeddings=L0)
    with pytest.raises(ValueError, match=match):
        EndPromptRotaryEmbedding(kv_channels=HEAD_DIM, use_cpu_initialization=True, yarn=yarn,
                                 **kwargs)


def test_scaling_from_megatron_args():
    from types import SimpleNamespace

    args = SimpleNamespace(endprompt_rope_scaling="ntk-by-parts", endprompt_pi_factor=16.0,
                           endprompt_original_length=L0, yarn_beta_fast=None,
                           yarn_beta_slow=None, yarn_correction_range_round_to_int=False)
    yarn = yarn_from_megatron_args(args)
    assert yarn == YarnScaling(factor=16.0, original_max_position_embeddings=L0,
                               truncate=False, attention_scaling=False)
    assert yarn.attention_factor() == 1.0
    assert yarn.megatron_config_fields()["yarn_mscale"] == 1.0
    assert yarn_from_megatron_args(SimpleNamespace()) is None  # old checkpoints: linear PI
