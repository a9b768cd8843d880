"""LoRA adapters on a tiny EndPromptGPTModel (local spec, CPU, gloo world size 1)."""

from __future__ import annotations

import pytest
import torch
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_endprompt.conversion.lora_export import merge_weight
from megatron_endprompt.errors import UserError
from megatron_endprompt.model import EndPromptGPTModel
from megatron_endprompt.model.lora import (
    LoraCheckpointing,
    LoraLinear,
    apply_lora,
    lora_linears,
)
from megatron_endprompt.model.lora_settings import LoraSettings, lora_settings

VOCAB, S, B = 128, 16, 2


def _model(tied: bool = False, **config):
    torch.manual_seed(1234)
    cfg = TransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
        ffn_hidden_size=128, normalization="RMSNorm", gated_linear_unit=True,
        add_bias_linear=False, use_cpu_initialization=True, init_method_std=0.2,
        hidden_dropout=0.0, attention_dropout=0.0, apply_rope_fusion=False,
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False, persist_layer_norm=False, **config)
    return EndPromptGPTModel(config=cfg,
                             transformer_layer_spec=get_gpt_layer_local_spec(
                                 normalization="RMSNorm"),
                             vocab_size=VOCAB, max_sequence_length=S,
                             position_embedding_type="rope", rotary_base=500000, pi_factor=4.0,
                             share_embeddings_and_output_weights=tied)


def _batch():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (B, S), generator=gen)
    mask = torch.triu(torch.ones(1, 1, S, S, dtype=torch.bool), diagonal=1)
    pos = torch.cat((torch.arange(6), torch.arange(64 - (S - 6), 64)))[None].repeat(B, 1)
    return ids, pos, mask


SETTINGS = LoraSettings(rank=4, alpha=8.0)


def test_zero_b_keeps_the_base_output_and_freezes_the_base(cpu_forward):
    base = _model().eval()
    ids, pos, mask = _batch()
    with torch.no_grad():
        want = base(ids, pos, mask)
    lora = apply_lora(base, SETTINGS)
    wrapped = lora_linears(lora)
    assert sorted(n.split(".", 2)[2] for n in wrapped) == sorted(
        f"{i}.{m}" for i in (0, 1) for m in ("self_attention.linear_qkv",
                                            "self_attention.linear_proj", "mlp.linear_fc1",
                                            "mlp.linear_fc2"))
    with torch.no_grad():
        got = lora(ids, pos, mask)
    assert torch.equal(got, want)
    trainable = sorted(n for n, p in lora.named_parameters() if p.requires_grad)
    assert trainable and all(n.endswith((".lora_a", ".lora_b")) for n in trainable)
    qkv = wrapped["decoder.layers.0.self_attention.linear_qkv"]
    assert qkv.lora_a.shape == (4, 64) and qkv.lora_b.shape == ((4 + 2 * 2) * 16, 4)
    assert qkv.weight is qkv.base.weight  # Megatron code reaching into the linear


def test_adapter_delta_is_scaled_b_a_x(cpu_forward):
    """With ``B != 0`` the wrapped linear returns exactly ``W x + (alpha/r) B A x``."""
    model = apply_lora(_model(), SETTINGS)
    fc2 = lora_linears(model)["decoder.layers.1.mlp.linear_fc2"]
    with torch.no_grad():
        fc2.lora_b.normal_()
    x = torch.randn(S, B, 128)
    out, bias = fc2(x)
    assert bias is None
    want = x @ merge_weight(fc2.base.weight, fc2.lora_a, fc2.lora_b, SETTINGS.scaling).T
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tied", [False, True])
def test_one_step_changes_only_adapters(cpu_forward, tied):
    """Tied input/output embeddings (SmolLM2, Llama-3.2) stay frozen like the rest."""
    model = apply_lora(_model(tied), SETTINGS)
    before = {k: v.detach().clone() for k, v in model.state_dict().items() if v is not None}
    ids, pos, mask = _batch()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        loss = model(ids, pos, mask, labels=ids).float().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    after = model.state_dict()
    changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert changed and all(k.endswith((".lora_a", ".lora_b")) for k in changed)
    assert any(k.endswith(".lora_b") for k in changed)


def test_checkpoint_keys_keep_the_base_stock(cpu_forward):
    stock = _model().sharded_state_dict()
    model = apply_lora(_model(), SETTINGS)
    sharded = model.sharded_state_dict()
    ckpt_keys = {v.key for v in sharded.values() if hasattr(v, "key")}
    stock_keys = {v.key for v in stock.values() if hasattr(v, "key")}
    assert stock_keys <= ckpt_keys
    extra = ckpt_keys - stock_keys
    assert extra == {f"decoder.layers.{p}.{f}" for p in (
        "self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1",
        "mlp.linear_fc2") for f in ("lora_a", "lora_b")}
    qkv_a = sharded["decoder.layers.0.self_attention.linear_qkv.lora_a"]
    assert qkv_a.global_shape == (2, 4, 64)  # layer-stacked like the base weight
    assert set(sharded) <= set(model.state_dict())  # what Megatron load_state_dict()s
    # torch state-dict keys: the stock ones plus the adapters (no ``base.`` level)
    stock_sd = set(_model().state_dict())
    assert set(model.state_dict()) == stock_sd | {
        k.replace(".weight", f".{f}") for k in stock_sd if k.endswith((
            "linear_qkv.weight", "linear_proj.weight", "linear_fc1.weight", "linear_fc2.weight"))
        for f in ("lora_a", "lora_b")}
    # SwiGLU fc1: B's global rows are cat(gate, up), sharded like the weight
    fc1_b = sharded["decoder.layers.0.mlp.linear_fc1.lora_b"]
    assert type(fc1_b).__name__ == type(
        sharded["decoder.layers.0.mlp.linear_fc1.weight"]).__name__ == "ShardedTensorFactory"


def test_checkpoint_without_adapters_loads_the_base(cpu_forward):
    """A base checkpoint's tensors into the wrapped model; the adapters are not asked for and
    keep their initial values (a strict ``load_state_dict`` misses nothing)."""
    base = _model()
    with torch.no_grad():
        for p in base.parameters():
            p.add_(1.0)
    state = {k: v for k, v in base.state_dict().items()}
    model = apply_lora(_model(), SETTINGS,
                       checkpointing=LoraCheckpointing(adapters=False))
    offered = model.sharded_state_dict()
    assert not any(k.endswith((".lora_a", ".lora_b")) for k in offered)
    loaded = {k: state[k] for k in offered}  # the stock keys
    model.load_state_dict(loaded, strict=True)
    qkv = lora_linears(model)["decoder.layers.0.self_attention.linear_qkv"]
    assert torch.equal(qkv.base.weight, base.decoder.layers[0].self_attention.linear_qkv.weight)
    assert not qkv.lora_b.any()


def test_adapter_init_is_seeded_per_layer(cpu_forward):
    one = lora_linears(apply_lora(_model(), SETTINGS))
    two = lora_linears(apply_lora(_model(), SETTINGS))
    names = list(one)
    assert all(torch.equal(one[n].lora_a, two[n].lora_a) for n in names)
    assert not torch.equal(one[names[0]].lora_a, one[names[4]].lora_a)  # layer 1 differs


def test_targets_subset(cpu_forward):
    model = apply_lora(_model(), LoraSettings(rank=2, alpha=2.0, targets=("linear_qkv",)))
    assert all(n.endswith("linear_qkv") for n in lora_linears(model))
    assert isinstance(model.decoder.layers[0].mlp.linear_fc1, torch.nn.Module)
    assert not isinstance(model.decoder.layers[0].mlp.linear_fc1, LoraLinear)


@pytest.mark.parametrize("kwargs, message", [
    (dict(rank=-1), "--endprompt-lora-rank -1 must be > 0"),
    (dict(rank=4, alpha=0.0), "--endprompt-lora-alpha 0 must be > 0"),
    (dict(rank=4, dropout=1.0), "--endprompt-lora-dropout 1 must be in [0, 1)"),
    (dict(rank=4, targets=["linear_qkv", "q_proj"]), "--endprompt-lora-targets q_proj: not"),
    (dict(rank=None, alpha=16.0), "--endprompt-lora-alpha needs --endprompt-lora-rank"),
])
def test_bad_settings_name_the_flag(kwargs, message):
    full = dict(rank=None, alpha=None, dropout=None, targets=None) | kwargs
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        lora_settings(**full)


def test_settings_defaults():
    s = lora_settings(rank=8, alpha=None, dropout=None, targets=None)
    assert (s.rank, s.alpha, s.scaling, s.dropout) == (8, 8.0, 1.0, 0.0)
    assert s.targets == ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
    assert lora_settings(rank=0, alpha=None, dropout=None, targets=None) is None


def test_adapter_only_checkpoints_offer_the_adapters_alone(cpu_forward):
    """While loading an adapter-only checkpoint, and in every save under ``adapters_only``,
    the model offers the adapters alone; a strict load of them misses nothing."""
    checkpointing = LoraCheckpointing(base=False, adapters_only=True)
    model = apply_lora(_model(), SETTINGS, checkpointing=checkpointing)
    offered = model.sharded_state_dict()
    assert len(offered) == 16 and all(k.endswith((".lora_a", ".lora_b")) for k in offered)
    model.load_state_dict({k: v.data for k, v in model.state_dict(keep_vars=True).items()
                           if k in offered}, strict=True)
    ids, pos, mask = _batch()
    with torch.no_grad():
        model(ids, pos, mask)  # training started: saves hold the adapters only
    assert set(model.sharded_state_dict()) == set(offered)
    full = apply_lora(_model(), SETTINGS,
                      checkpointing=LoraCheckpointing(adapters=False))
    with torch.no_grad():
        full(ids, pos, mask)
    assert set(offered) < set(full.sharded_state_dict())  # without the option: everything
