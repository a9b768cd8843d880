"""YaRN / NTK-by-parts with EndPrompt positions through the model and the export: Megatron's
logits = HF's ``rope_type: yarn`` on a batch of mixed jumped layouts (so the attention factor is
applied where HF applies it), and a YaRN-trained checkpoint exports ``rope_type: yarn``."""

from __future__ import annotations

import pytest
import torch
from conversion_helpers import THETA, VOCAB, WINDOW, endprompt_positions, hf_model, read_config

from megatron_endprompt.model import YarnScaling

L, S, SEQ = 1024, 16.0, 48


def _batch():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (3, SEQ), generator=gen)
    pos = torch.cat([endprompt_positions(SEQ, a, L - shift) for a, shift in
                     ((40, 0), (20, 100), (47, 7))])
    return ids, pos


def _hf_yarn(extra=None):
    return {"rope_type": "yarn", "factor": S, "original_max_position_embeddings": WINDOW,
            "rope_theta": THETA, **(extra or {})}


@pytest.mark.parametrize("attention_scaling", [True, False])
def test_logits_match_hf_yarn_with_endprompt_positions(tiny_hf, converted, megatron_forward,
                                                       attention_scaling):
    yarn = YarnScaling(factor=S, original_max_position_embeddings=WINDOW,
                       attention_scaling=attention_scaling)
    ids, pos = _batch()
    mg = megatron_forward(converted, ids, pos, 1.0, yarn=yarn)
    hf_extra = None if attention_scaling else {"attention_factor": 1.0}
    hf = hf_model(tiny_hf, max_position_embeddings=L, rope_parameters=_hf_yarn(hf_extra))
    with torch.no_grad():
        ref = hf(input_ids=ids, position_ids=pos).logits
    diff = (mg.logits[..., :VOCAB] - ref).abs().max().item()
    print(f"yarn attention_scaling={attention_scaling}: max |logit diff| = {diff:.3e}")
    assert diff <= 1e-4
    # the other variant's logits are far: the attention factor is really applied (or not)
    other = hf_model(tiny_hf, max_position_embeddings=L,
                     rope_parameters=_hf_yarn({"attention_factor": 1.0} if attention_scaling
                                              else None))
    with torch.no_grad():
        assert (other(input_ids=ids, position_ids=pos).logits - ref).abs().max() > 1e-3
    linear = megatron_forward(converted, ids, pos, S)  # and YaRN is not PI
    assert (linear.logits - mg.logits).abs().max() > 1e-2


@pytest.fixture(scope="module")
def yarn_trained(converted, tmp_path_factory):
    """``converted`` re-saved as if trained with ``--endprompt-rope-scaling yarn`` at L=1024
    (s=16 over L0=64): the args an EndPrompt YaRN run records."""
    from megatron_endprompt.conversion.megatron_ckpt import (
        build_gpt_model,
        find_checkpoint,
        load_common_state,
        load_model_weights,
        save_release_checkpoint,
        single_process_group,
    )

    out = str(tmp_path_factory.mktemp("yarn_run"))
    ckpt = find_checkpoint(converted)
    with single_process_group():
        args = load_common_state(ckpt)["args"]
        model = build_gpt_model(args)
        load_model_weights(model, ckpt)
        args.endprompt_rope_scaling = "yarn"
        args.endprompt_target_length, args.endprompt_original_length = L, WINDOW
        args.endprompt_pi_factor = S
        save_release_checkpoint(model, args, out)
    return out


def test_yarn_run_exports_rope_type_yarn(yarn_trained, tmp_path, run_tool, megatron_forward):
    from transformers import AutoConfig

    from megatron_endprompt.cli.convert import main

    out = tmp_path / "exported"
    rc, _, err = run_tool(main, ["megatron-to-hf", "--checkpoint", yarn_trained, "--output",
                                 out, "--no-progress"])
    assert rc == 0, err
    cfg = read_config(str(out))
    scaling = {"rope_type": "yarn", "factor": S, "original_max_position_embeddings": WINDOW,
               "beta_fast": 32.0, "beta_slow": 1.0}
    assert cfg["rope_parameters"] == {**scaling, "rope_theta": THETA}
    assert cfg["rope_scaling"] == {"type": "yarn", **scaling}
    assert cfg["max_position_embeddings"] == L and cfg["rope_theta"] == THETA
    auto = AutoConfig.from_pretrained(out)
    assert auto.rope_parameters["rope_type"] == "yarn"
    model = hf_model(str(out))
    assert model.model.rotary_emb.attention_scaling == pytest.approx(
        0.1 * torch.log(torch.tensor(S)).item() + 1)
    ids, pos = _batch()
    with torch.no_grad():
        got = model(input_ids=ids, position_ids=pos).logits
    yarn = YarnScaling(factor=S, original_max_position_embeddings=WINDOW)
    mg = megatron_forward(yarn_trained, ids, pos, 1.0, yarn=yarn)
    assert (got - mg.logits[..., :VOCAB]).abs().max().item() <= 1e-4


def test_yarn_export_refuses_factor_other_than_l_over_l0(yarn_trained, tmp_path, run_tool):
    """HF readers take YaRN's factor from ``factor`` or from L/L0: they must agree."""
    from megatron_endprompt.cli.convert import main

    out = tmp_path / "bad"
    rc, _, err = run_tool(main, ["megatron-to-hf", "--checkpoint", yarn_trained, "--output",
                                 out, "--target-length", 2000, "--no-progress"])
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "--target-length 1024" in lines[0] and not out.exists()


def test_ntk_by_parts_exports_attention_factor_one(tiny_hf):
    """NTK-by-parts = YaRN's frequencies with attention factor 1, as HF spells it; HF's RoPE
    module built from the exported config then has ``attention_scaling == 1``."""
    from dataclasses import replace

    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from megatron_endprompt.conversion.hf_config import hf_config_dict, read_hf_config

    ntk = YarnScaling(factor=S, original_max_position_embeddings=WINDOW, truncate=False,
                      attention_scaling=False)
    spec = replace(read_hf_config(tiny_hf), yarn=ntk)
    cfg = hf_config_dict(spec, target_length=L, pi_factor=S)
    assert cfg["rope_parameters"]["attention_factor"] == 1.0
    assert cfg["rope_parameters"]["truncate"] is False
    rope = LlamaRotaryEmbedding(LlamaConfig(**cfg))
    assert rope.attention_scaling == 1.0
    ours = ntk.inv_freq(spec.head_dim, THETA)
    assert torch.equal(rope.inv_freq, ours)
