"""STOP_GRACE of examples/pretrain_llama3_endprompt.sh: after a requested stop (EXIT_SIGNAL),
workers still running STOP_GRACE seconds later are shut down through torchrun (its own signal,
then SIGKILL after SHUTDOWN_TIMEOUT) and the launch exits non-zero with the STOP_GRACE line and
the "stop: torchrun exited" line, never "stopped as requested". Real script, real torchrun, a
worker that never stops (tests/examples/stubborn_worker.py, through the same PATH shim as
tests/examples/test_clean_stop.py); the timer is the subject, so no training runs."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import pytest
from launch_fixtures import REPO, launch_env

from megatron_endprompt.launch import free_port

pytestmark = pytest.mark.process  # the launcher with torchrun and a worker

SCRIPT = os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stubborn_worker.py")
GRACE_S = 3
SHIM = r"""#!/usr/bin/env bash
# torchrun shim: the script's torchrun options, then the stand-in worker for its module
opts=()
while [ "$1" != "-m" ]; do opts+=("$1"); shift; done
shift 2
exec "$REAL_PYTHON" -m torch.distributed.run "${opts[@]}" "$STOP_WORKER" "$@"
"""


def _start(tmp_path, mode: str):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(SHIM)
    (bin_dir / "torchrun").chmod(0o755 | stat.S_IEXEC)
    stop_dir = tmp_path / "stop"
    stop_dir.mkdir()
    env = {**launch_env(tmp_path), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "REAL_PYTHON": sys.executable, "STOP_WORKER": WORKER, "STOP_DIR": str(stop_dir),
           "STUBBORN": mode, "GPUS_PER_NODE": "1", "TP": "1", "MASTER_PORT": str(free_port()),
           "STOP_GRACE": str(GRACE_S), "STOP_POLL_SECONDS": "0.5", "SHUTDOWN_TIMEOUT": "2"}
    proc = subprocess.Popen(["bash", SCRIPT], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (stop_dir / "ready.0").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"worker did not start: {proc.communicate()[0][-3000:]}")
        time.sleep(0.1)
    return proc, stop_dir, int((stop_dir / "ready.0").read_text())


@pytest.mark.parametrize("mode", ["caught", "starting"])
def test_workers_still_running_after_stop_grace_are_shut_down(tmp_path, mode):
    """``caught``: the worker got EXIT_SIGNAL (once) and did not stop; ``starting``: it never
    installed a handler, so it never got the signal. Either way the launch ends after
    STOP_GRACE, not before, and the worker is gone."""
    proc, stop_dir, pid = _start(tmp_path, mode)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    time.sleep(GRACE_S - 1)
    assert proc.poll() is None and _alive(pid), "shut down before STOP_GRACE"
    try:
        out, _ = proc.communicate(timeout=45)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0]
        pytest.fail(f"still running 45 s after the stop (STOP_GRACE={GRACE_S}): {out[-3000:]}")
    elapsed = time.monotonic() - t0
    assert elapsed >= GRACE_S, elapsed
    assert proc.returncode != 0, out[-3000:]
    never = "" if mode == "caught" else "; 1 still starting, never sent it"
    assert (f"workers still running {GRACE_S} s after SIGTERM (STOP_GRACE{never}): shutting "
            "torchrun down") in out, out[-3000:]
    assert f"SIGTERM stop: torchrun exited {proc.returncode}" in out, out[-3000:]
    assert "stopped as requested" not in out
    got = (stop_dir / "got.0").read_text().split() if (stop_dir / "got.0").exists() else []
    assert len(got) == (1 if mode == "caught" else 0), got  # sent once, never re-sent
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the worker survived the shutdown"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purpose
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("var, value, says", [
    ("STOP_GRACE", "30m", "STOP_GRACE='30m' is not an integer"),
    ("SHUTDOWN_TIMEOUT", "-1", "SHUTDOWN_TIMEOUT=-1 must be >= 0"),
    ("STOP_POLL_SECONDS", "0", "STOP_POLL_SECONDS='0': give seconds > 0"),
])
def test_bad_stop_timing_is_one_line_at_dry_run(tmp_path, var, value, says):
    """Read by bash only after a stop request (``[ ... -ge "$STOP_GRACE" ]`` failing at every
    poll, so the grace never ends), so checked with the other values before torchrun."""
    proc = subprocess.run(["bash", SCRIPT, "--dry-run"], env={**launch_env(tmp_path), var: value},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], proc.stderr
