"""Children of a training rank (Megatron's checkpoint writers) exit when
the rank is killed, instead of living on re-parented to init."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

PARENT = textwrap.dedent("""
    import multiprocessing as mp, os, sys, time
    if sys.argv[2] == "1":
        from megatron_endprompt.runtime.child_death import install_child_reaper
        install_child_reaper()

    def writer(ready):
        open(ready, "w").close()  # started: guards armed, imports done
        time.sleep(120)

    if __name__ == "__main__":
        ready = sys.argv[3]
        p = mp.get_context(sys.argv[1]).Process(target=writer, args=(ready,))
        p.start()
        deadline = time.monotonic() + 120
        while not os.path.exists(ready) and time.monotonic() < deadline:
            time.sleep(0.05)
        print(p.pid, flush=True)
        time.sleep(120)
""")


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":  # zombie of init: exited
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("method,installed", [("fork", True), ("spawn", True), ("fork", False)])
def test_child_exits_with_killed_parent(method, installed, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    proc = subprocess.Popen([sys.executable, str(script), method, str(int(installed)),
                             str(tmp_path / "ready")], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    try:
        # without the reaper the orphan lives on
        assert _gone(child, 5.0 if installed else 1.5) == installed
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_install_is_idempotent_and_undone():
    import multiprocessing.process as mpp

    from megatron_endprompt.runtime.child_death import install_child_reaper, \
        uninstall_child_reaper

    original = mpp.BaseProcess.start
    assert install_child_reaper() is True
    assert install_child_reaper() is False
    assert mpp.BaseProcess.start is not original
    uninstall_child_reaper()
    assert mpp.BaseProcess.start is original
