"""Qwen2 / Qwen2.5 (QKV bias) and Qwen3 (QK-norm) through conversion both ways: HF -> Megatron
-> HF bit-exact, Megatron logits = HF's with EndPrompt positions (mixed layouts in one batch),
the export loading with ``AutoModelForCausalLM``."""

from __future__ import annotations

import pytest
import torch
from conversion_helpers import HEADS, HIDDEN, VOCAB, assert_matches_linear_pi_hf, \
    endprompt_positions, hf_model, hf_tensors, read_config
from qwen_helpers import QWEN_LAYERS, QWEN_THETA, make_qwen_model

L, S_PI, SEQ = 1024, 16.0, 48
FAMILIES = ("qwen2", "qwen3")


@pytest.fixture(scope="module", params=FAMILIES)
def qwen(request, tmp_path_factory):
    """``(model_type, hf_dir, converted checkpoint dir)``; converted at TP=2 (vocab padding)."""
    from megatron_endprompt.conversion import HFToMegatronOptions, convert_hf_to_megatron

    model_type = request.param
    root = tmp_path_factory.mktemp(model_type)
    hf = make_qwen_model(str(root / "hf"), model_type)
    out = str(root / "mg")
    summary = convert_hf_to_megatron(HFToMegatronOptions(hf_dir=hf, output=out,
                                                         tensor_parallel_size=2,
                                                         progress=False))
    flag = {"qwen2": "--add-qkv-bias", "qwen3": "--qk-layernorm"}[model_type]
    assert flag in summary["megatron_flags"] and "--disable-bias-linear" in summary[
        "megatron_flags"]
    return model_type, hf, out


def _batch():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=gen)
    pos = torch.cat((endprompt_positions(SEQ, 40, L), endprompt_positions(SEQ, 20, L - 100)))
    return ids, pos


def test_logits_match_hf_with_endprompt_positions(qwen, megatron_forward):
    """Megatron (s=16, EndPrompt positions, rows with different layouts) vs HF with linear RoPE
    scaling 16 at the same positions: max |diff| <= 1e-4."""
    _, hf_dir, ckpt = qwen
    ids, pos = _batch()
    mg = megatron_forward(ckpt, ids, pos, S_PI)
    assert_matches_linear_pi_hf(mg.logits, hf_dir, ids, pos, pi_factor=S_PI, theta=QWEN_THETA,
                                label=qwen[0])


def test_the_family_tensors_are_used(qwen, megatron_forward, tmp_path):
    """Zeroing the family's extra tensors (q/k/v biases; q/k norms -> 1) changes HF's logits,
    so the parity above covers them."""
    model_type, hf_dir, _ = qwen
    model = hf_model(hf_dir)
    ids, pos = _batch()
    with torch.no_grad():
        ref = model(input_ids=ids, position_ids=pos).logits
        for layer in model.model.layers:
            attn = layer.self_attn
            if model_type == "qwen2":
                for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                    proj.bias.zero_()
            else:
                attn.q_norm.weight.fill_(1.0)
                attn.k_norm.weight.fill_(1.0)
        assert (model(input_ids=ids, position_ids=pos).logits - ref).abs().max() > 1e-2


def test_round_trip_is_bit_exact_and_export_loads(qwen, megatron_forward, tmp_path, run_tool):
    from transformers import AutoConfig

    from megatron_endprompt.cli.convert import main

    model_type, hf_dir, ckpt = qwen
    out = tmp_path / "exported"
    rc, _, err = run_tool(main, ["megatron-to-hf", "--checkpoint", ckpt, "--output", out,
                                 "--target-length", L, "--pi-factor", S_PI, "--no-progress"])
    assert rc == 0, err
    src, dst = hf_tensors(hf_dir), hf_tensors(str(out))
    assert sorted(src) == sorted(dst)
    extra = {"qwen2": "self_attn.q_proj.bias", "qwen3": "self_attn.q_norm.weight"}[model_type]
    assert sum(name.endswith(extra) for name in dst) == QWEN_LAYERS
    for name in src:
        assert src[name].dtype == dst[name].dtype and torch.equal(src[name], dst[name]), name
    cfg = read_config(str(out))
    source = read_config(hf_dir)
    assert cfg["model_type"] == model_type
    assert cfg["architectures"] == source["architectures"]
    assert cfg["head_dim"] == source.get("head_dim", HIDDEN // HEADS)
    assert cfg["sliding_window"] is None
    assert cfg["rope_parameters"] == {"rope_type": "linear", "factor": S_PI,
                                      "rope_theta": QWEN_THETA}
    assert cfg["max_position_embeddings"] == L
    assert type(AutoConfig.from_pretrained(out)).__name__ == type(
        AutoConfig.from_pretrained(hf_dir)).__name__
    model = hf_model(str(out))
    assert type(model).__name__ == source["architectures"][0]
    ids, pos = _batch()
    with torch.no_grad():
        got = model(input_ids=ids, position_ids=pos).logits
    mg = megatron_forward(ckpt, ids, pos, S_PI)
    assert (got - mg.logits[..., :VOCAB]).abs().max().item() <= 1e-4


def test_family_from_megatron_args_without_record():
    """A checkpoint trained from scratch records no HF model_type: the flags decide."""
    from types import SimpleNamespace

    from megatron_endprompt.conversion.families import family_from_megatron_args
    from megatron_endprompt.errors import UserError

    def args(**kw):
        return SimpleNamespace(endprompt_hf_config=None, **kw)

    assert family_from_megatron_args(args(add_qkv_bias=True)).model_type == "qwen2"
    assert family_from_megatron_args(args(qk_layernorm=True)).model_type == "qwen3"
    assert family_from_megatron_args(args()).model_type == "llama"
    mistral = SimpleNamespace(endprompt_hf_config={"model_type": "mistral"})
    assert family_from_megatron_args(mistral).model_type == "mistral"
    with pytest.raises(UserError, match="both --add-qkv-bias and --qk-layernorm"):
        family_from_megatron_args(args(add_qkv_bias=True, qk_layernorm=True))


def test_qwen3_attention_bias_refused(run_tool, tmp_path):
    """Qwen3's ``attention_bias`` also biases o_proj, which Megatron's --add-qkv-bias has not:
    refused in one line, nothing written."""
    from megatron_endprompt.cli.convert import main

    hf = make_qwen_model(str(tmp_path / "biased"), "qwen3", num_hidden_layers=1,
                         attention_bias=True)
    out = tmp_path / "out"
    rc, _, err = run_tool(main, ["hf-to-megatron", "--hf-dir", hf, "--output", out,
                                 "--no-progress"])
    assert rc == 2 and err.strip().startswith("error: ") and "attention_bias=true" in err
    assert not out.exists()


def test_rotary_base_is_an_integer_flag(qwen):
    """Qwen's rope_theta 1e6 reaches Megatron as ``--rotary-base 1000000`` (``:g`` formatting
    wrote ``1e+06``, which Megatron's int parser refused); a fractional base is refused."""
    from dataclasses import replace

    from megatron_endprompt.conversion.hf_config import megatron_flags, read_hf_config
    from megatron_endprompt.errors import UserError

    spec = read_hf_config(qwen[1])
    flags = megatron_flags(spec)
    assert flags[flags.index("--rotary-base") + 1] == "1000000"
    with pytest.raises(UserError, match="not an integer"):
        megatron_flags(replace(spec, rope_theta=10000.5))
