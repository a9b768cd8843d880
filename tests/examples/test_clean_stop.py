"""A requested stop of examples/pretrain_llama3_endprompt.sh ends cleanly (a cluster's preemption):
the script's real path, real torchrun (2 ranks, gloo) and Megatron's own exit-signal handler class
(tests/examples/stop_worker.py stands in for the model: a PATH shim runs the script's torchrun
command with the worker instead of ``-m megatron_endprompt.training.pretrain``). On EXIT_SIGNAL --
SIGUSR1 as the sbatch sets, sent to the script or, as SLURM does, to its process group -- every
rank "saves", the script exits 0, and there is no torchrun traceback.
Before the fix torchrun handled the signal itself: it forwarded it, waited, then raised
``SignalException``: a traceback and exit 1 after a clean save."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from launch_fixtures import launch_env

pytestmark = pytest.mark.process  # the launcher with torchrun and its workers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stop_worker.py")

SHIM = r"""#!/usr/bin/env bash
# torchrun shim: the script's torchrun options, then the stand-in worker for its module
opts=()
while [ "$1" != "-m" ]; do opts+=("$1"); shift; done
shift 2
exec "$REAL_PYTHON" -m torch.distributed.run "${opts[@]}" "$STOP_WORKER" "$@"
"""


def _start(tmp_path, exit_signal: str | None):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "torchrun"
    shim.write_text(SHIM)
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    stop_dir = tmp_path / "stop"
    stop_dir.mkdir()
    env = {**launch_env(tmp_path), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "REAL_PYTHON": sys.executable, "STOP_WORKER": WORKER, "STOP_DIR": str(stop_dir),
           "GPUS_PER_NODE": "2", "TP": "1", "MASTER_PORT": str(_free_port()),
           "SHUTDOWN_TIMEOUT": "30"}
    if exit_signal:
        env["EXIT_SIGNAL"] = exit_signal
    proc = subprocess.Popen(["bash", SCRIPT], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not all((stop_dir / f"ready.{r}").exists() for r in (0, 1)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"workers did not start: {proc.communicate()[0][-3000:]}")
        time.sleep(0.1)
    return proc, stop_dir


def _free_port() -> int:
    from megatron_endprompt.launch import free_port

    return free_port()


# The default SIGTERM sent to the script: test_launch_real_trainer.py, with the real trainer.
@pytest.mark.parametrize("exit_signal, to_group", [("SIGUSR1", False), ("SIGUSR1", True)])
def test_requested_stop_saves_and_exits_0(tmp_path, exit_signal, to_group):
    proc, stop_dir = _start(tmp_path, exit_signal)
    sig = signal.Signals[exit_signal or "SIGTERM"]
    if to_group:  # as slurmstepd signals a task: its whole process group (script and torchrun)
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, out[-3000:]
    assert all((stop_dir / f"saved.{r}").exists() for r in (0, 1)), out[-3000:]
    assert "Traceback" not in out and "SignalException" not in out, out[-3000:]
    assert f"stopped as requested ({sig.name}): checkpoint saved, exit 0" in out


def test_other_signal_reaches_torchrun_and_its_workers(tmp_path):
    """SIGTERM (torchrun's, not the exit signal) sent to the script (no longer exec'd into
    torchrun) is passed on: torchrun shuts its workers down and the script exits with its
    status instead of leaving torchrun and the workers running."""
    proc, stop_dir = _start(tmp_path, "SIGUSR1")
    pids = [int((stop_dir / f"ready.{r}").read_text()) for r in (0, 1)]
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode != 0, out[-3000:]
    assert not any((stop_dir / f"saved.{r}").exists() for r in (0, 1))
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), out[-3000:]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purpose
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False
