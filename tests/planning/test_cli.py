"""``tools/plan_endprompt_run.py``: table, JSON, plot, and one-line errors that leave previous
output intact."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from megatron_endprompt.cli.plan import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = ["--model", "llama3-8b", "--gpus", "32", "--sweep", "32768,65536"]


def test_table_json_and_plot(run_tool, tmp_path):
    plot = tmp_path / "plan.png"
    rc, out, err = run_tool(main, [*BASE, "--plot", plot])
    assert rc == 0, err
    assert "EndPrompt P=8192" in out and "full-length L=65536" in out
    assert "layout (cheapest that fits)" in out and "GPU-hours for 1e+09 tokens" in out
    assert "compute_weight_and_optimizer_memory" in out  # says where figures come from
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".plan-")]

    rc, out, err = run_tool(main, [*BASE, "--json", "--recompute", "full"])
    assert rc == 0, err
    doc = json.loads(out)
    assert set(doc["plans"]) == {"endprompt", "full", "full_same_layout"}
    ep, full = doc["plans"]["endprompt"], doc["plans"]["full"]
    assert ep["seq_length"] == 8192 and full["seq_length"] == 65536
    assert ep["fits"] and full["fits"]
    for key in ("weights", "gradients", "optimizer", "activations", "total"):
        assert ep["memory_gib"][key] >= 0
    assert [r["target_length"] for r in doc["sweep"]] == [32768, 65536]
    assert doc["settings"]["mfu"] == 0.4 and doc["settings"]["recompute"] == "full"


def test_bad_input_is_one_line_and_keeps_previous_plot(run_tool, tmp_path):
    plot = tmp_path / "plan.png"
    plot.write_bytes(b"previous")
    cases = [
        ([*BASE, "--tp", "3", "--plot", plot], "--tp 3"),
        ([*BASE, "--sweep", "64k", "--plot", plot], "--sweep"),
        ([*BASE, "--plot", tmp_path / "missing" / "p.png"], "does not exist"),
        ([*BASE, "--plot", tmp_path / "p.txt"], ".png"),
        (["--hf-config", tmp_path / "nope.json"], "--hf-config"),
        ([*BASE, "--target-length", "4096"], "--target-length"),
    ]
    for argv, needle in cases:
        rc, out, err = run_tool(main, argv)
        assert rc == 2 and err.startswith("error: ") and needle in err, (argv, err)
        assert err.count("\n") == 1 and "Traceback" not in err
    assert plot.read_bytes() == b"previous"


def test_tool_script_runs():
    env = dict(os.environ, PYTHONPATH=ROOT)
    res = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plan_endprompt_run.py"),
                          "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0 and "--target-length" in res.stdout


@pytest.mark.process
def test_plan_vs_measured_runs_on_cpu(tmp_path):
    """``benchmarks/step_time/plan_vs_measured.py`` (what ``gpu_check.sh`` runs on CUDA) in its
    CPU form: the local-spec prediction beside the measured saved-tensor bytes, ratio 1."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("MASTER_PORT", None)  # a port of this session's gloo group: let the script pick
    out = tmp_path / "pvm.json"
    res = subprocess.run([sys.executable, "-m", "benchmarks.step_time.plan_vs_measured",
                          "--device", "cpu", "--threads", "1", "--hidden", "64", "--layers", "1",
                          "--vocab", "256", "--seq-length", "32", "--out", str(out)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(out.read_text())
    for case in ("endprompt_P", "full_L"):
        ratio = doc["cases"][case]["ratios"]["activations (saved tensors)"]
        assert abs(ratio - 1) <= 0.10, (case, ratio)
    assert "predicted" in res.stdout and "measured" in res.stdout


def _mixtral_config(path):
    """Mixtral-8x7B's shape (its config.json's fields): 8 experts of a Llama-layout MLP."""
    path.write_text(json.dumps({
        "model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
        "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
        "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2}))
    return path


@pytest.mark.parametrize("case", ["moe", "eval_length", "tokens_nan", "tokens_inf",
                                  "binary_script", "plot_dir"])
def test_more_bad_input_is_one_line(run_tool, tmp_path, case):
    """A MoE config (planned as dense before), an unbounded --eval-length (costed before),
    --tokens nan/inf (accepted before), a binary --launch-script and a --plot that is a
    directory (tracebacks before): one line each, nothing written."""
    (tmp_path / "plots.png").mkdir()
    binary = tmp_path / "launch.sh"
    binary.write_bytes(bytes(range(256)) * 4)
    argv, needle = {
        "moe": (["--hf-config", _mixtral_config(tmp_path / "config.json"), "--seq-length",
                 "8192", "--target-length", "131072", "--sweep", "65536"],
                "mixture-of-experts"),
        "eval_length": ([*BASE, "--eval-length", str(10**12)], "--eval-length 1000000000000"),
        "tokens_nan": ([*BASE, "--tokens", "nan"], "--tokens"),
        "tokens_inf": ([*BASE, "--tokens", "inf"], "--tokens"),
        "binary_script": ([*BASE, "--launch-script", binary], "--launch-script"),
        "plot_dir": ([*BASE, "--plot", tmp_path / "plots.png"], "--plot"),
    }[case]
    rc, out, err = run_tool(main, argv)
    assert rc == 2 and err.startswith("error: ") and needle in err, (argv, err)
    assert err.count("\n") == 1 and "Traceback" not in err
    assert os.listdir(tmp_path / "plots.png") == []


def test_global_batch_tokens_not_a_multiple_is_reported_as_planned(run_tool):
    """--global-batch-tokens 100000 at P=8192 cannot be planned exactly (whole sequences, a
    multiple of DP x micro-batch): the table must say the tokens/step it plans (the launch
    line's GLOBAL_BATCH x 8192), not echo 100,000."""
    import re

    rc, out, err = run_tool(main, [*BASE, "--global-batch-tokens", "100000"])
    assert rc == 0, err
    planned = int(re.search(r"GLOBAL_BATCH=(\d+) ", out).group(1)) * 8192
    assert planned != 100_000
    assumptions = next(line for line in out.splitlines() if line.startswith("assumptions:"))
    assert "100,000 tokens/step," not in assumptions  # the old echo
    assert f"100,000 tokens/step requested, planned {planned:,} (EndPrompt)" in assumptions
    row = next(line for line in out.splitlines() if line.startswith("tokens / step"))
    assert f"{planned:,}" in row
    rc, out, err = run_tool(main, [*BASE, "--global-batch-tokens", str(64 * 65536)])
    assert rc == 0 and f"{64 * 65536:,} tokens/step," in out, err
