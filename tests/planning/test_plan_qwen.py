"""Qwen presets in the planner: published parameter counts (QKV biases and QK norms counted),
and a plan for a long-context run."""

from __future__ import annotations

import json

from megatron_endprompt.planning import MODEL_PRESETS
from megatron_endprompt.planning.plan import total_params
from megatron_endprompt.planning.presets import model_from_hf_config


def test_qwen_parameter_counts_are_the_published_ones():
    # HF safetensors totals of Qwen/Qwen2.5-7B (7.61B) and Qwen/Qwen3-8B (8.2B)
    assert total_params(MODEL_PRESETS["qwen2.5-7b"]) == 7_615_616_512
    assert total_params(MODEL_PRESETS["qwen3-8b"]) == 8_190_735_360


def test_hf_config_of_a_qwen_model_keeps_its_family(tmp_path):
    cfg = {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584,
           "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
           "vocab_size": 152064, "max_position_embeddings": 32768}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = model_from_hf_config(str(tmp_path))
    assert spec.qkv_bias and not spec.qk_norm
    assert total_params(spec) == total_params(MODEL_PRESETS["qwen2.5-7b"])


def test_plan_for_qwen_presets_from_the_cli(run_tool):
    """``--model qwen2.5-7b|qwen3-8b``: the preset's shape and full parameter count reach the
    plan; EndPrompt at P=32k for L=128k fits on 32 H100s and costs fewer GPU-hours than
    full-length training at L."""
    from megatron_endprompt.cli.plan import main

    for preset in ("qwen2.5-7b", "qwen3-8b"):
        rc, out, err = run_tool(main, ["--model", preset, "--seq-length", 32768,
                                       "--target-length", 131072, "--gpus", 32, "--json"])
        assert rc == 0, err
        doc = json.loads(out)
        model = doc["settings"]["model"]
        assert model["name"] == preset and model["original_window"] == 32768
        assert model["params"] == total_params(MODEL_PRESETS[preset])
        plans = doc["plans"]
        assert plans["endprompt"]["fits"]
        assert plans["endprompt"]["gpu_hours"] < plans["full"]["gpu_hours"]
