"""A LoRA run's checkpoint exported both ways: merged into a plain HF model, and as a PEFT
adapter directory that HF ``peft`` loads onto the original HF model.

``converted`` (the tiny HF Llama at TP=2) trains 2 iterations with adapters at TP=2 (the real
trainer under torchrun); the Megatron model with its adapters (in process, TP=1) is the
reference for both exports' logits at EndPrompt positions.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from conversion_helpers import VOCAB, endprompt_positions, hf_model, \
    train_converted

from megatron_endprompt.model.lora_settings import LoraSettings
from tests.support.checkpoint_model import causal_logits, checkpoint_model

pytestmark = pytest.mark.process

P, L, RANK, ALPHA = 64, 512, 4, 8.0


@pytest.fixture(scope="module")
def lora_checkpoint(converted, data_prefix, tmp_path_factory) -> str:
    return train_converted(converted, data_prefix, tmp_path_factory.mktemp("lora"), "lora_tp2",
                           "--tensor-model-parallel-size", "2", "--train-iters", "2",
                           "--lr", "2e-2", "--min-lr", "2e-2", "--lr-decay-style", "constant",
                           "--save-interval", "2", "--eval-iters", "0", "--eval-interval",
                           "1000", "--endprompt-lora-rank", str(RANK),
                           "--endprompt-lora-alpha", str(ALPHA), seq_length=P, target_length=L)


def _megatron_logits(path, ids, pos):
    """The checkpoint in ``EndPromptGPTModel`` with its adapters (TP=PP=1, CPU)."""
    from megatron_endprompt.conversion.megatron_ckpt import build_gpt_model
    from megatron_endprompt.model import EndPromptGPTModel
    from megatron_endprompt.model.lora import apply_lora, lora_linears

    def build(args):
        model = build_gpt_model(args, cls=EndPromptGPTModel, pi_factor=8.0)
        return apply_lora(model, LoraSettings(rank=RANK, alpha=ALPHA))

    with checkpoint_model(path, build) as model:
        assert all(m.lora_b.abs().sum() > 0 for m in lora_linears(model).values())
        return causal_logits(model, ids, pos)[..., :VOCAB]


def _export(run_tool, ckpt, out, *flags):
    from megatron_endprompt.cli.convert import main

    rc, stdout, err = run_tool(main, ["megatron-to-hf", "--checkpoint", ckpt, "--output", out,
                                      "--no-progress", *flags])
    assert rc == 0, err
    return stdout


def test_merged_and_peft_exports_reproduce_the_adapted_model(lora_checkpoint, tiny_hf, tmp_path,
                                                             run_tool):
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    ids = torch.randint(0, VOCAB, (1, P), generator=torch.Generator().manual_seed(3))
    pos = endprompt_positions(P, 40, L)
    mg = _megatron_logits(lora_checkpoint, ids, pos)

    merged_dir = str(tmp_path / "merged")
    stdout = _export(run_tool, lora_checkpoint, merged_dir)
    assert f"LoRA adapters (r={RANK}, alpha=8): merged into the weights" in stdout
    with torch.no_grad():
        merged = hf_model(merged_dir)(input_ids=ids, position_ids=pos).logits
    diff = (merged - mg).abs().max().item()
    assert diff <= 1e-4, diff

    peft_dir = str(tmp_path / "peft")
    stdout = _export(run_tool, lora_checkpoint, peft_dir, "--lora-format", "peft")
    assert "written for PEFT" in stdout
    assert not any(f.startswith("model") for f in os.listdir(peft_dir))  # no base tensors
    with open(os.path.join(peft_dir, "adapter_config.json")) as f:
        cfg = json.load(f)
    assert (cfg["r"], cfg["lora_alpha"]) == (RANK, ALPHA)
    assert cfg["target_modules"] == sorted(["q_proj", "k_proj", "v_proj", "o_proj",
                                            "gate_proj", "up_proj", "down_proj"])
    # the original HF model (its weights: the frozen base) with the EndPrompt RoPE config
    base = AutoModelForCausalLM.from_pretrained(
        tiny_hf, config=AutoConfig.from_pretrained(peft_dir), dtype=torch.float32,
        attn_implementation="eager")
    with torch.no_grad():
        plain = base(input_ids=ids, position_ids=pos).logits
        adapted = PeftModel.from_pretrained(base, peft_dir).eval()(
            input_ids=ids, position_ids=pos).logits
    assert (plain - mg).abs().max().item() > 100 * diff  # the adapters matter
    peft_diff = (adapted - mg).abs().max().item()
    assert peft_diff <= 1e-4, peft_diff
    print(f"max |logit diff| vs Megatron with adapters: merged {diff:.2e}, peft {peft_diff:.2e}"
          f"; adapters' effect {(plain - mg).abs().max().item():.2e}")


def test_peft_format_without_adapters_is_refused(converted, tmp_path, run_tool):
    from megatron_endprompt.cli.convert import main

    out = str(tmp_path / "peft")
    rc, _, err = run_tool(main, ["megatron-to-hf", "--checkpoint", converted,
                                 "--output", out, "--no-progress", "--lora-format", "peft"])
    assert rc == 2 and err.count("error:") == 1, err
    assert "holds no LoRA adapters" in err and not os.path.exists(out)
