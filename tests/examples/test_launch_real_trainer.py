"""examples/pretrain_llama3_endprompt.sh with the real trainer on CPU (two gloo ranks, the
toy base of real_launch.py, no model flag and no --transformer-impl: the launcher picks
``local`` here):

* a rank's one-line refusal ends the launch with that line and exit 2, no torchrun traceback,
  and leaves no CHECKPOINT_OUT behind (no empty ``tensorboard/``); before, every rank refused
  ``--transformer-impl transformer_engine`` (which the script hard-coded) and torchrun's
  traceback followed, exit 1;
* a SIGTERM stop whose save (and teardown) takes longer than the launcher's poll interval exits
  0 with the checkpoint saved; before, the launcher re-sent the signal every interval until
  torchrun exited, and a re-send that reached a rank after Megatron's handler was gone killed
  it (torchrun traceback, "torchrun exited 1");
* the console is quiet: iteration lines and our own lines, not Megatron's argument table nor
  the library warnings, which are in the launch log in CHECKPOINT_OUT; no line holds two
  ranks' text;
* a dry run over that saved run with a larger TRAIN_ITERS is refused in one line naming the
  scheduler flag that continues it, and passes with the flag.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import time

import pytest
from real_launch import CPU_FLAGS, SCRIPT, launch_env, toy_base, toy_prefix

pytestmark = pytest.mark.process  # the launcher, torchrun and two real trainer ranks

#: The launcher's poll interval in the stop test: well under the save and teardown time (the
#: toy's two-rank torch_dist save takes ~0.15 s on 2 loaded cores; the old launcher re-sent the
#: stop every interval, so a short one is the harder case for it).
POLL_S = 0.02


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("real_launch")
    return toy_base(str(root)), toy_prefix(str(root))


def _console(proc_out: str) -> list[str]:
    return proc_out.splitlines()


def test_a_rank_refusal_is_its_one_line_and_exit_2(toy, tmp_path):
    base, prefix = toy
    env = launch_env(base, prefix, str(tmp_path))
    proc = subprocess.run(["bash", SCRIPT, *CPU_FLAGS, "--endprompt-terminal-loss-weight", "-1"],
                          env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "terminal loss weight" in errors[0], out[-3000:]
    assert "Traceback" not in out and "ChildFailedError" not in out, out[-3000:]
    assert not os.path.exists(env["CHECKPOINT_OUT"]), os.listdir(env["CHECKPOINT_OUT"])


@pytest.fixture(scope="module")
def stopped(toy, tmp_path_factory):
    """A launch (a long TRAIN_ITERS) stopped with SIGTERM once iteration 2 is logged:
    ``(env, returncode, console text, launch log text)``."""
    base, prefix = toy
    tmp = str(tmp_path_factory.mktemp("stopped"))
    env = launch_env(base, prefix, tmp, TRAIN_ITERS="100000",
                     STOP_POLL_SECONDS=str(POLL_S))
    proc = subprocess.Popen(["bash", SCRIPT, *CPU_FLAGS], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    logs = os.path.join(env["CHECKPOINT_OUT"], "logs", "train-*.log")
    deadline = time.monotonic() + 420
    try:
        while True:
            found = glob.glob(logs)
            if found and re.search(r"iteration +2/", open(found[0]).read()):
                break
            assert proc.poll() is None and time.monotonic() < deadline, \
                proc.communicate()[0][-3000:]
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    with open(glob.glob(logs)[0]) as f:
        return env, proc.returncode, out, f.read()


def test_sigterm_stop_with_a_slow_save_exits_0(stopped):
    env, rc, out, log = stopped
    assert rc == 0, out[-3000:]
    assert "stopped as requested (SIGTERM): checkpoint saved, exit 0" in out
    assert "Traceback" not in out and "SignalException" not in out, out[-3000:]
    with open(os.path.join(env["CHECKPOINT_OUT"], "latest_checkpointed_iteration.txt")) as f:
        assert int(f.read()) >= 2
    # the save alone outlasted the poll interval (the teardown comes on top)
    save_ms = re.search(r"save-checkpoint \.+: \(([\d.]+), ([\d.]+)\)", log)
    assert save_ms and float(save_ms.group(2)) > POLL_S * 1000, log[-2000:]


def test_console_is_quiet_and_the_log_has_the_rest(stopped):
    env, _, out, log = stopped
    lines = out.splitlines()
    assert any(re.search(r"iteration +2/ *100000 \|.*lm loss", line) for line in lines), out
    assert any(line.startswith("EndPrompt: L=512") for line in lines), out
    assert "note: --transformer-impl local (" in out
    where = [line for line in lines if line.startswith("launch log")]
    assert len(where) == 1 and where[0].endswith(".log") and os.path.isfile(where[0].split()[-1])
    # Megatron's argument table and the library warnings: in the log, not on the console
    assert re.search(r"^\[rank0\]: -+ arguments -+$", log, re.M)
    assert "UserWarning" in log
    assert not re.search(r"-+ arguments -+|end of arguments|Warning: |warnings\.warn", out)
    assert not re.search(r"^\s*micro_batch_size \.+ ", out, re.M)
    assert len(lines) < len(log.splitlines()) / 5, (len(lines), len(log.splitlines()))
    # whole lines per rank: one tag at the start of a line, never inside one
    assert "[rank" not in out
    assert not re.search(r".\[rank\d+\]: ", log)


def test_dry_run_over_the_saved_run_names_the_scheduler_flag(stopped):
    env, rc, _, _ = stopped
    assert rc == 0
    more = {**env, "TRAIN_ITERS": "200000"}
    proc = subprocess.run(["bash", SCRIPT, "--dry-run", *CPU_FLAGS], env=more,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: TRAIN_ITERS=200000: "), proc.stderr
    assert "--train-iters 100000" in lines[0] and "--override-opt_param-scheduler" in lines[0]
    for flags in (["--override-opt_param-scheduler"], []):
        ok = subprocess.run(["bash", SCRIPT, "--dry-run", *CPU_FLAGS, *flags],
                            env=more if flags else env, capture_output=True, text=True,
                            timeout=300)
        assert ok.returncode == 0, ok.stderr
