"""Context parallelism on the CPU runtime: accepted by the pretrain entry, the launcher and
the planner's paste line (a GPU without Transformer Engine keeps its one-line refusal)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap

import pytest

from megatron_endprompt.cli.plan import main as plan_main
from tests.support.torchrun import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "examples", "pretrain_llama3_endprompt.sh")
sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "examples"))
from launch_fixtures import launch_env  # noqa: E402


def _python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([REPO_ROOT, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=300, cwd=REPO_ROOT)


@pytest.mark.process
def test_cp_refused_on_a_gpu_without_te_accepted_on_the_cpu_runtime() -> None:
    """A faked GPU (no CPU layer) without Transformer Engine: the one-line refusal. The CPU
    runtime (its context-parallel attention installed): accepted. Before, the CPU was refused
    too."""
    proc = _python("""
        import argparse, torch
        real = torch.cuda.is_available
        torch.cuda.is_available = lambda: True          # a GPU machine, as far as we know
        from megatron_endprompt import runtime
        from megatron_endprompt.errors import UserError
        from megatron_endprompt.training import checks
        args = argparse.Namespace(context_parallel_size=2, transformer_impl="local")
        assert not runtime.install(verbose=False)["cpu"]
        try:
            checks._check_context_parallel(args)
        except UserError as exc:
            print("GPU:", exc)
        runtime.uninstall()
        torch.cuda.is_available = real
        assert runtime.install(verbose=False)["cpu"]
        checks._check_context_parallel(args)
        print("CPU: accepted")
    """)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gpu, cpu = proc.stdout.strip().splitlines()
    assert gpu == ("GPU: --context-parallel-size 2 needs Transformer Engine's attention "
                   "(--transformer-impl is local); use --transformer-impl transformer_engine on "
                   "GPUs with Transformer Engine, or --context-parallel-size 1"), gpu
    assert cpu == "CPU: accepted"


def _dry_run(tmp_path, **variables) -> list[str]:
    env = {**launch_env(tmp_path), **variables}
    proc = subprocess.run(["bash", SCRIPT, "--dry-run", "--transformer-impl", "local"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return shlex.split(proc.stdout)


@pytest.mark.process
def test_planner_paste_line_with_cp2_passes_the_launcher_dry_run(run_tool, tmp_path) -> None:
    """The planner's line with ``--cp 2`` pasted into the launcher's ``--dry-run`` on a CPU
    (``--transformer-impl local`` appended last, so it wins over the script's TE)."""
    rc, out, err = run_tool(plan_main, ["--model", "llama3-8b", "--gpus", "16", "--cp", "2"])
    assert rc == 0, err
    line = out.split("EndPrompt plan):\n", 1)[1].splitlines()[0]
    variables = dict(word.split("=", 1) for word in shlex.split(line))
    assert variables["CP"] == "2", line
    words = _dry_run(tmp_path, **variables)
    assert words[words.index("--context-parallel-size") + 1] == "2"
    assert words[-2:] == ["--transformer-impl", "local"]
