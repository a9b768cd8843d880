"""EndPromptGPTModel vs stock GPTModel on a tiny CPU model (gloo, world size 1)."""

from __future__ import annotations

import pytest
import torch
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_endprompt.model import EndPromptGPTModel, EndPromptRotaryEmbedding

VOCAB, S, B = 128, 16, 2


def tiny_config(**overrides) -> TransformerConfig:
    fields = dict(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=128,
        normalization="RMSNorm",
        gated_linear_unit=True,
        add_bias_linear=False,
        use_cpu_initialization=True,
        init_method_std=0.2,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        apply_rope_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )
    fields.update(overrides)
    return TransformerConfig(**fields)


def build(cls, config: TransformerConfig | None = None, **kwargs):
    torch.manual_seed(1234)
    return cls(
        config=config or tiny_config(),
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=VOCAB,
        max_sequence_length=S,
        position_embedding_type="rope",
        rotary_base=500000,
        **kwargs,
    )


def batch():
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, VOCAB, (B, S), generator=gen)
    mask = torch.triu(torch.ones(1, 1, S, S, dtype=torch.bool), diagonal=1)
    return input_ids, mask


def endprompt_positions(a: int, target_length: int) -> torch.Tensor:
    """One row: context ``0..a-1`` then terminal ``L-(S-a)..L-1``."""
    return torch.cat((torch.arange(a), torch.arange(target_length - (S - a), target_length)))


@pytest.fixture
def stock_and_ours(cpu_forward):
    stock = build(GPTModel)
    ours = build(EndPromptGPTModel, pi_factor=1.0)
    ours.load_state_dict(stock.state_dict(), strict=True)
    return stock.eval(), ours.eval()


def test_state_dict_keys_are_stock(cpu_forward) -> None:
    stock = build(GPTModel)
    ours = build(EndPromptGPTModel, pi_factor=8.0)
    assert isinstance(ours.rotary_pos_emb, EndPromptRotaryEmbedding)
    assert list(ours.state_dict().keys()) == list(stock.state_dict().keys())
    assert sorted(ours.sharded_state_dict().keys()) == sorted(stock.sharded_state_dict().keys())
    assert not any("rotary" in k for k in ours.state_dict())
    # Old checkpoints that stored inv_freq still load strictly (stock drops the key).
    sd = dict(stock.state_dict())
    sd["rotary_pos_emb.inv_freq"] = ours.rotary_pos_emb.inv_freq.clone()
    ours.load_state_dict(sd, strict=True)
    stock.load_state_dict(ours.state_dict(), strict=True)


def test_contiguous_positions_equal_stock_forward(stock_and_ours) -> None:
    stock, ours = stock_and_ours
    input_ids, mask = batch()
    position_ids = torch.arange(S)[None].repeat(B, 1)
    with torch.no_grad():
        expected = stock(input_ids, position_ids, mask)
        got = ours(input_ids, position_ids, mask)
    assert got.shape == (B, S, VOCAB)
    assert torch.equal(got, expected)


def test_endprompt_positions_change_output(stock_and_ours) -> None:
    stock, ours = stock_and_ours
    input_ids, mask = batch()
    contiguous = torch.arange(S)[None].repeat(B, 1)
    jumped = torch.stack([endprompt_positions(10, 4096), endprompt_positions(6, 4096)])
    with torch.no_grad():
        base = ours(input_ids, contiguous, mask)
        out = ours(input_ids, jumped, mask)
    # causal: tokens before the first jump (position 6) see only identical positions
    assert torch.allclose(out[:, :6], base[:, :6], atol=1e-5)
    assert (out[:, 6:] - base[:, 6:]).abs().max() > 1e-3
    # per-row result equals running each row alone (mixed layouts -> [S, B, 1, D] freqs)
    with torch.no_grad():
        for b in range(B):
            row = ours(input_ids[b : b + 1], jumped[b : b + 1], mask)
            assert torch.allclose(row, out[b : b + 1], atol=1e-5)


def test_pi_factor_divides_positions(cpu_forward) -> None:
    """s=4 at positions p equals s=1 at positions p/4 (float positions)."""
    input_ids, mask = batch()
    pos = torch.stack([endprompt_positions(8, 64), endprompt_positions(8, 64)])
    scaled = build(EndPromptGPTModel, pi_factor=4.0).eval()
    plain = build(EndPromptGPTModel, pi_factor=1.0).eval()
    plain.load_state_dict(scaled.state_dict())
    with torch.no_grad():
        a = scaled(input_ids, pos, mask)
        b = plain(input_ids, pos.float() / 4, mask)
    assert torch.allclose(a, b, atol=1e-5)


def test_non_first_stage_uses_position_ids(cpu_forward) -> None:
    """A stage without the embedding (pipeline middle/last) builds RoPE from ``position_ids``
    too, and refuses to run without them."""
    stage = build(EndPromptGPTModel, pre_process=False, pi_factor=2.0).eval()
    assert_stage_uses_position_ids(stage, torch.stack([endprompt_positions(10, 4096)] * B))


def assert_stage_uses_position_ids(stage: torch.nn.Module, jumped: torch.Tensor) -> None:
    """``stage`` (no embedding: fed hidden states ``[S, B, 64]``) gives other outputs at the
    ``jumped`` positions ``[B, S]`` than at contiguous ones, and refuses to run without
    positions or with positions of the wrong length."""
    _, mask = batch()
    hidden = torch.randn(S, B, 64, generator=torch.Generator().manual_seed(3))
    contiguous = torch.arange(S)[None].repeat(B, 1)
    with torch.no_grad():
        stage.set_input_tensor(hidden)
        a = stage(None, contiguous, mask)
        stage.set_input_tensor(hidden)
        b = stage(None, jumped, mask)
        assert (a - b).abs().max() > 1e-3
        stage.set_input_tensor(hidden)
        with pytest.raises(ValueError, match="every pipeline stage"):
            stage(None, None, mask)
        stage.set_input_tensor(hidden)
        with pytest.raises(ValueError, match="sequence length"):
            stage(None, contiguous[:, : S // 2], mask)  # e.g. positions sliced for CP twice


def test_refuses_configs_it_cannot_serve(cpu_forward) -> None:
    with pytest.raises(ValueError, match="rope"):
        torch.manual_seed(0)
        EndPromptGPTModel(
            config=tiny_config(),
            transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
            vocab_size=VOCAB,
            max_sequence_length=S,
            position_embedding_type="learned_absolute",
        )
    with pytest.raises(ValueError, match="disagrees"):
        build(EndPromptGPTModel, pi_factor=8.0, seq_len_interpolation_factor=4.0)
