"""GPU-only checks (``pytest -m gpu``): Transformer Engine paths the CPU suite cannot reach."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def runtime_installed():
    """What the pretrain entry does first: on a GPU, the wheel fixes and the TE fused-RoPE router
    for per-row freqs, never the CPU layer; restored afterwards."""
    from megatron_endprompt import runtime

    layers = runtime.install()
    yield layers
    runtime.uninstall()


def test_runtime_on_a_real_gpu(runtime_installed):
    import megatron.core.datasets.utils as ds_utils

    assert runtime_installed["wheel"] and not runtime_installed["cpu"]
    te = pytest.importorskip("transformer_engine")
    assert te is not None and runtime_installed["rope"], "TE present: the RoPE router is in"
    ds_utils.compile_helpers()  # the wheel's stock version exits the process here


def _positions(B: int, S: int, L: int, shared: bool) -> torch.Tensor:
    rows = []
    for r in range(B):
        b = 64 if shared or r % 2 == 0 else 96
        rows.append(torch.cat([torch.arange(S - b), torch.arange(L - b, L)]))
    return torch.stack(rows).cuda()


@pytest.mark.parametrize("shared", [True, False])
def test_te_fused_rope_matches_unfused(shared):
    """Shared layouts give [S,1,1,D] (TE's fused kernel); mixed ones [S,B,1,D] (unfused).
    Both must equal the unfused reference, row by row."""
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
    from megatron.core.transformer import TransformerConfig

    from megatron_endprompt.model.rope import EndPromptRotaryEmbedding

    S, B, H, D, L = 512, 2, 4, 64, 4096
    rope = EndPromptRotaryEmbedding(kv_channels=D, rotary_percent=1.0, rotary_base=500000,
                                    pi_factor=8.0).cuda()
    pos = _positions(B, S, L, shared)
    freqs = rope(pos)
    assert freqs.shape == ((S, 1, 1, D) if shared else (S, B, 1, D))
    q = torch.randn(S, B, H, D, device="cuda")
    fused_cfg = TransformerConfig(num_layers=1, hidden_size=H * D, num_attention_heads=H,
                                  apply_rope_fusion=True)
    plain_cfg = TransformerConfig(num_layers=1, hidden_size=H * D, num_attention_heads=H,
                                  apply_rope_fusion=False)
    got = apply_rotary_pos_emb(q, freqs, config=fused_cfg)
    for r in range(B):
        ref = apply_rotary_pos_emb(q[:, r:r + 1], rope(pos[r:r + 1]), config=plain_cfg)
        torch.testing.assert_close(got[:, r:r + 1], ref, rtol=1e-5, atol=1e-5)


def test_te_endprompt_model_forward_bf16():
    """EndPromptGPTModel with the TE layer spec runs at bf16 with EndPrompt positions and its
    loss differs from contiguous positions only through RoPE."""
    import os

    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    from megatron_endprompt.model import EndPromptGPTModel

    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29655")
        torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    cfg = TransformerConfig(num_layers=2, hidden_size=256, ffn_hidden_size=512,
                            num_attention_heads=4, num_query_groups=2, normalization="RMSNorm",
                            gated_linear_unit=True, add_bias_linear=False, bf16=True,
                            params_dtype=torch.bfloat16, apply_rope_fusion=True)
    model = EndPromptGPTModel(config=cfg,
                              transformer_layer_spec=get_gpt_layer_with_transformer_engine_spec(),
                              vocab_size=1024, max_sequence_length=4096,
                              position_embedding_type="rope", pi_factor=8.0).cuda()
    S, B = 512, 2
    tokens = torch.randint(0, 1024, (B, S), device="cuda")
    for shared in (True, False):  # [S,1,1,D] into TE's fused RoPE; [S,B,1,D] via the router
        pos = _positions(B, S, 4096, shared=shared)
        loss = model(tokens, pos, None, labels=tokens).float().mean()
        loss.backward()
        assert torch.isfinite(loss)
