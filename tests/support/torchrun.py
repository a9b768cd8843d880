"""The tests' one way to start a script on N local ranks: ``torchrun`` (as
``python -m torch.distributed.run``, so the venv's interpreter runs it) on a free port, with the
repository root on the ranks' ``PYTHONPATH`` (a worker script may import ``tests.support``;
pytest's ``pythonpath`` setting reaches only pytest's own process)."""

from __future__ import annotations

import os
import subprocess
import sys

from megatron_endprompt import runtime
from megatron_endprompt.launch import free_port

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Seconds a tiny multi-rank run may take before the test fails (CPU, gloo, 2 loaded cores).
TIMEOUT_S = 300


def torchrun_cmd(script: str, *args: str, nproc: int) -> list[str]:
    """``python -m torch.distributed.run --nproc_per_node N ... SCRIPT ARGS`` on 127.0.0.1 and
    a port free now."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
            str(script), *map(str, args)]


def run_torchrun(script: str, *args: str, nproc: int, timeout: float = TIMEOUT_S,
                 env: dict[str, str] | None = None,
                 cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run ``script`` on ``nproc`` ranks; stdout/stderr captured as text. The caller asserts on
    the exit code (its message wants the log tail it cares about). ``env``: the ranks'
    environment (default: this process's), the repository root put first on its
    ``PYTHONPATH``."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    return subprocess.run(torchrun_cmd(script, *args, nproc=nproc), capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=cwd, check=False)


def install_rank_runtime(*, verbose: bool = False) -> None:
    """In a worker rank this module started: Megatron imported without its import-time
    ``torch.compile`` (``runtime.import_megatron_eager``, ~2-3 s less per rank on CPU), then the
    runtime installed, before the worker imports Megatron itself."""
    runtime.import_megatron_eager()
    runtime.install(verbose=verbose)
