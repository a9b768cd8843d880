"""The README's commands: `make demo` runs end to end here; `make check` is the fast tier;
`make test` is what CI runs."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_starts_with_its_commands_and_ci_calls_the_test_one():
    readme = open(os.path.join(REPO, "README.md")).read()
    block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make demo", "make check", "make test"]
    ci = open(os.path.join(REPO, ".ci", "run")).read()
    assert "make test" in ci
    makefile = open(os.path.join(REPO, "Makefile")).read()
    assert "find_python312.sh" in makefile
    # the commands make would run (-n: printed, not run; the venv step may print first)
    def planned(target: str) -> str:
        proc = subprocess.run(["make", "-n", "-s", "-C", REPO, target], capture_output=True,
                              text=True, env={**os.environ, "MAKEFLAGS": ""}, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().splitlines()[-1]

    # every tier, on two xdist workers that keep a file's tests (and its fixtures) together
    assert planned("test").endswith("pytest -q -n 2 --dist loadfile tests")
    assert planned("check").endswith('pytest -q -n 2 --dist loadfile -m "not slow" tests')


@pytest.mark.e2e
def test_make_demo_runs_end_to_end(tmp_path):
    env = {**os.environ, "MAKEFLAGS": ""}
    proc = subprocess.run(["make", "-C", REPO, "demo"], capture_output=True, text=True,
                          env=env, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "wrote " in out and re.search(r"^samples: [0-9,]+  tokens in samples", out, re.M)
    assert "datasets via BlendedMegatronDatasetBuilder" in out
    m = re.search(r"training loss: iteration 1 ([0-9.]+) -> iteration (\d+) ([0-9.]+) "
                  r"\(falls\)", out)
    assert m, out[-3000:]
    assert float(m.group(3)) < float(m.group(1)) - 0.5
    assert os.path.isdir(os.path.join(REPO, "demo_out", "checkpoints"))
    export = os.path.join(REPO, "demo_out", "hf_export")
    config = json.load(open(os.path.join(export, "config.json")))
    assert config["max_position_embeddings"] == 2048 and config["rope_scaling"]["factor"] == 8.0
