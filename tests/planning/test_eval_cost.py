"""The planner's cost of evaluating at L (the one EndPrompt cost that grows with L), against
the textbook count: ``2 x (GEMM parameters) x L`` plus causal attention ``2 L^2 q`` per layer."""

from __future__ import annotations

import json

import pytest

from megatron_endprompt.cli.plan import main
from megatron_endprompt.planning import GPU_PRESETS, MODEL_PRESETS, PlanSettings
from megatron_endprompt.planning.eval_cost import eval_cost
from megatron_endprompt.planning.memory import GIB
from megatron_endprompt.planning.plan import total_params

L8B = MODEL_PRESETS["llama3-8b"]
H100 = GPU_PRESETS["h100-80gb"]


def _settings(**kw) -> PlanSettings:
    return PlanSettings(**{**dict(model=L8B, gpu=H100, gpus=32, tokens=1e9, seq_length=8192,
                                  target_length=65536), **kw})


@pytest.mark.parametrize("length", [32768, 65536, 131072])
def test_prefill_flops_and_gpu_seconds(length):
    e = eval_cost(_settings(), length=length, tasks=13, samples_per_task=50)
    gemm_params = total_params(L8B) - L8B.vocab_size * L8B.hidden_size  # input embedding: no GEMM
    attention = 2 * length ** 2 * 4096 * 32  # QK^T and PV over the lower triangle, 32 layers
    textbook = 2 * gemm_params * length + attention
    assert e.prefill_flops == pytest.approx(textbook, rel=0.02)
    assert e.attention_flops == pytest.approx(attention, rel=1e-9)
    assert e.gpu_seconds == pytest.approx(13 * 50 * e.prefill_flops / (989e12 * 0.40), rel=1e-9)


def test_memory_at_L():
    e = eval_cost(_settings(), length=65536)
    assert e.kv_cache_bytes == 2 * 32 * 8 * 128 * 65536 * 2  # K and V, 32 layers, 8 x 128, bf16
    assert e.kv_cache_bytes / GIB == 8
    assert e.logits_bytes == 128256 * 65536 * 4
    assert e.weights_bytes == total_params(L8B) * 2
    assert e.memory_bytes / GIB == pytest.approx(59.5, abs=0.1)
    assert e.gpus_for_memory(_settings().usable_bytes) == 1
    assert eval_cost(_settings(), length=131072).gpus_for_memory(_settings().usable_bytes) == 2


def test_planner_prints_the_64k_evaluation_cost(run_tool):
    rc, out, err = run_tool(main, ["--model", "llama3-8b", "--gpus", "32"])
    assert rc == 0, err
    text = out.split("evaluation at L=65536 (13 tasks x 100 samples", 1)[1]
    assert "prefill FLOPs / sample: 2.11 PFLOP" in text and "causal attention" in text
    assert "1,300 samples" in text and "KV cache 8.0 GiB" in text
    rc, out, err = run_tool(main, ["--model", "llama3-8b", "--json", "--eval-length", "131072",
                                   "--eval-samples", "10"])
    assert rc == 0, err
    doc = json.loads(out)["evaluation"]
    assert doc["length"] == 131072 and doc["tasks"] == 13 and doc["samples_per_task"] == 10


def test_plan_settings_refuse_L_equal_to_P():
    """The planner's own rule was L >= P; EndPromptWindow's (training's) is L > P and L >= L0
    (L = L0 plans a run at the model's own window, s = 1)."""
    with pytest.raises(ValueError, match="must be larger than seq length"):
        _settings(target_length=8192)
    with pytest.raises(ValueError, match="is below the original context window 8192") as exc:
        _settings(seq_length=2048, target_length=4096)
    # the planner has no --endprompt-original-length: its L0 is the model's window
    assert "--endprompt-original-length" not in str(exc.value)
    assert "--model / --hf-config (its max_position_embeddings)" in str(exc.value)
    assert _settings(seq_length=4096, target_length=8192).target_length == 8192
