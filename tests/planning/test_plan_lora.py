"""The planner's LoRA row: Llama-3 8B, EndPrompt 8K -> 64K on one 80 GB GPU."""

from __future__ import annotations

import json

from megatron_endprompt.cli.plan import main
from megatron_endprompt.planning.lora import adapter_params
from megatron_endprompt.planning.presets import MODEL_PRESETS

ONE_GPU = ["--model", "llama3-8b", "--gpus", "1", "--gpu", "h100-80gb", "--seq-length", "8192",
           "--target-length", "65536", "--sweep", "65536"]


def test_adapter_count_is_r_times_in_plus_out_per_linear():
    # per layer: qkv 4096 + 6144, proj 4096 + 4096, fc1 4096 + 2 x 14336, fc2 14336 + 4096
    assert adapter_params(MODEL_PRESETS["llama3-8b"], 16) == 16 * 32 * (
        10240 + 8192 + 32768 + 18432)


def test_llama3_8b_lora_fits_one_80gb_gpu_where_full_training_does_not(run_tool):
    rc, out, err = run_tool(main, [*ONE_GPU, "--lora-rank", "16"])
    assert rc == 0, err
    lines = out.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("LoRA r=16"))
    assert "35.7M trainable parameters (0.44% of 8.03B)" in lines[row]
    assert lines[row + 1].endswith(": fits") and "TP1 PP1 CP1 DP1" in lines[row + 1]
    assert lines[row + 2].strip().startswith("launch: TP=1 PP=1 CP=1") \
        and lines[row + 2].endswith("GPUS_PER_NODE=1 SEQ_LENGTH=8192 ORIGINAL_LENGTH=8192 "
                                    "TARGET_LENGTH=65536 TRAIN_ITERS=954 LORA_RANK=16")
    rc, out, err = run_tool(main, [*ONE_GPU, "--lora-rank", "16", "--json"])
    doc = json.loads(out)
    assert doc["lora"]["fits"] and not doc["plans"]["endprompt"]["fits"]
    lora, full = doc["lora"]["memory_gib"], doc["plans"]["endprompt"]["memory_gib"]
    assert lora["activations"] == full["activations"]
    assert lora["gradients"] < 0.01 * full["gradients"] and lora["total"] < 72


def test_bad_lora_rank_is_one_error_line(run_tool):
    rc, _, err = run_tool(main, [*ONE_GPU, "--lora-rank", "0"])
    assert rc == 2 and err.strip() == "error: --lora-rank 0 must be > 0"
