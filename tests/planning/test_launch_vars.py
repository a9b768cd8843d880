"""The planner plans what examples/pretrain_llama3_endprompt.sh launches: its defaults are the
script's, its printed launch line passes the script's ``--dry-run`` checks, and it prints the
wall-clock and the checkpoint size per save; inputs it cannot plan are one error line."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from megatron_endprompt.cli.plan import main
from megatron_endprompt.planning.launch_vars import script_defaults

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")
sys.path.insert(0, os.path.join(REPO, "tests", "examples"))
from launch_fixtures import launch_env  # noqa: E402


def test_defaults_are_read_from_the_script():
    """One source: the planner's defaults are what bash resolves from the script (its
    ``--dry-run``), and a changed script changes the planner's defaults."""
    d = script_defaults()
    proc = subprocess.run(["bash", SCRIPT, "--dry-run"], env=launch_env_fake(), capture_output=True,
                          text=True, timeout=60)
    words = shlex.split(proc.stdout)
    flag = {"TP": "--tensor-model-parallel-size", "PP": "--pipeline-model-parallel-size",
            "CP": "--context-parallel-size", "GPUS_PER_NODE": "--nproc_per_node",
            "MICRO_BATCH": "--micro-batch-size", "GLOBAL_BATCH": "--global-batch-size",
            "SEQ_LENGTH": "--seq-length", "ORIGINAL_LENGTH": "--max-position-embeddings",
            "TARGET_LENGTH": "--endprompt-target-length", "RECOMPUTE": "--recompute-granularity"}
    assert {v: words[words.index(f) + 1] for v, f in flag.items()} == d


def launch_env_fake() -> dict[str, str]:
    """The script's environment with a stub checker (the values, not the paths, matter here)."""
    return {"PATH": os.environ["PATH"], "PYTHON": "true", "CHECKPOINT_IN": "/i",
            "CHECKPOINT_OUT": "/o", "TOKENIZER": "/t", "DATA_PREFIX": "/d"}


def test_changed_script_defaults_change_the_plan(run_tool, tmp_path):
    text = open(SCRIPT).read()
    for old, new in (("SEQ_LENGTH=${SEQ_LENGTH:-8192}", "SEQ_LENGTH=${SEQ_LENGTH:-4096}"),
                     ("GLOBAL_BATCH=${GLOBAL_BATCH:-128}", "GLOBAL_BATCH=${GLOBAL_BATCH:-64}"),
                     ("GPUS_PER_NODE=${GPUS_PER_NODE:-8}", "GPUS_PER_NODE=${GPUS_PER_NODE:-4}"),
                     ("--recompute-granularity selective", "--recompute-granularity full")):
        assert old in text
        text = text.replace(old, new)
    script = tmp_path / "launch.sh"
    script.write_text(text)
    rc, out, err = run_tool(main, ["--model", "llama3-8b", "--gpus", "32", "--launch-script",
                                   script])
    assert rc == 0, err
    assert "recompute full" in out and f"{64 * 4096:,} tokens/step" in out
    line = out.split("EndPrompt plan):\n", 1)[1].splitlines()[0]
    assert "SEQ_LENGTH=4096" in line and "NNODES=8 GPUS_PER_NODE=4" in line
    rc, out, err = run_tool(main, ["--model", "llama3-8b", "--launch-script", tmp_path / "no.sh"])
    assert rc == 2 and out == "" and err.startswith("error: --launch-script ")
    assert err.count("\n") == 1


def test_short_sequences_take_tp_before_cp(run_tool):
    """At P = 8K the planner's layout has CP=1, as the script (CP is for evaluation lengths);
    full-length at 64K still takes CP."""
    rc, out, err = run_tool(main, ["--model", "llama3-8b", "--gpus", "32", "--json"])
    assert rc == 0, err
    plans = json.loads(out)["plans"]
    assert plans["endprompt"]["layout"]["cp"] == 1 and plans["endprompt"]["fits"]
    assert plans["full"]["layout"]["cp"] > 1


def test_printed_launch_line_passes_the_dry_run(run_tool, tmp_path):
    rc, out, err = run_tool(main, ["--model", "llama3-8b", "--gpus", "32"])
    assert rc == 0, err
    assert "recompute selective" in out and "1,048,576 tokens/step" in out
    line = out.split("EndPrompt plan):\n", 1)[1].splitlines()[0].strip()
    assert line.startswith("TP=") and "NNODES=4" in line and "GLOBAL_BATCH=" in line
    wall = re.search(r"wall-clock: ([0-9.]+) h .*MFU 40%", out)
    assert wall and float(wall.group(1)) > 0
    size = re.search(r"checkpoint: (\d+) GB per save", out)
    assert size and 105 <= int(size.group(1)) <= 115  # 8.03e9 params x 14 B
    env = {**launch_env(tmp_path), **dict(v.split("=", 1) for v in shlex.split(line))}
    proc = subprocess.run(["bash", SCRIPT, "--dry-run"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout)
    tp = re.search(r"TP=(\d+)", line).group(1)
    assert words[words.index("--tensor-model-parallel-size") + 1] == tp


@pytest.mark.parametrize("argv, says", [
    (["--target-length", str(10**12)], "--target-length 1000000000000"),
    (["--global-batch-tokens", "100"], "below one sample"),
    (["--sweep", "4096"], "--sweep 4096"),
    (["--target-length", "8192"], "must be larger than seq length P=8192"),
    (["--eval-samples", "0"], "--eval-samples 0: each must be positive"),
])
def test_unplannable_inputs_are_one_line(run_tool, argv, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_tool(main, ["--model", "llama3-8b", *argv])
    assert rc == 2 and out == "" and err.startswith("error: ") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and says in err
    assert os.listdir(tmp_path) == []  # nothing written
