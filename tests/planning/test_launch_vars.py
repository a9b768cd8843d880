"""The planner plans what examples/pretrain_llama3_endprompt.sh launches: its defaults are the
script's, its printed launch line passes the script's ``--dry-run`` checks, and it prints the
wall-clock and the checkpoint size per save; inputs it cannot plan are one error line."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from megatron_endprompt.cli.plan import main
from megatron_endprompt.planning.launch_vars import SCRIPT_DEFAULTS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")
sys.path.insert(0, os.path.join(REPO, "tests", "examples"))
from launch_fixtures import launch_env  # noqa: E402


def test_defaults_are_the_scripts():
    text = open(SCRIPT).read()
    script = dict(re.findall(r"^([A-Z_]+)=\$\{\1:-([^}]*)\}", text, flags=re.M))
    assert {k: script.get(k) for k in SCRIPT_DEFAULTS if k != "RECOMPUTE"} == \
        {k: v for k, v in SCRIPT_DEFAULTS.items() if k != "RECOMPUTE"}
    assert f"--recompute-granularity {SCRIPT_DEFAULTS['RECOMPUTE']}" in text


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
])
def test_unplannable_inputs_are_one_line(run_tool, argv, says):
    rc, out, err = run_tool(main, ["--model", "llama3-8b", *argv])
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and says in err
