"""Child processes of a training rank exit with it (issue 9 item 10).

Why: Megatron's asynchronous checkpointing starts writer processes (``fork`` in
``TemporalAsyncCaller``, ``spawn`` in ``PersistentAsyncCaller`` and the results ``Manager``);
when a scheduler kills the rank, those children are re-parented to init and live on, holding
hundreds of MB each. Here every ``multiprocessing`` child started while installed runs its
target behind a small guard that

* asks Linux to ``SIGKILL`` it when its parent dies (``prctl(PR_SET_PDEATHSIG)``; only for
  children started from the main thread, since the kernel ties the signal to the *thread*
  that forked), and
* checks once a second from a daemon thread that its parent is still the same process (any
  platform, any starting thread; also covers a parent that died before ``prctl``).

The patch is on ``multiprocessing.process.BaseProcess.start`` (so fork, spawn, forkserver and
``Manager`` processes are all covered), undone by :func:`uninstall_child_reaper`.
"""

from __future__ import annotations

import ctypes
import multiprocessing.process
import os
import signal
import sys
import threading
from typing import Any, Callable

__all__ = ["install_child_reaper", "uninstall_child_reaper", "die_with_parent"]

_PR_SET_PDEATHSIG = 1
_original_start: Callable[..., Any] | None = None


def die_with_parent(parent_pid: int, *, pdeathsig: bool = True, poll_s: float = 1.0) -> None:
    """Arm the guards in the current (child) process for parent ``parent_pid``."""
    if pdeathsig and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before we could arm anything
        os._exit(1)

    def watch() -> None:
        import time

        while True:
            time.sleep(poll_s)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="endprompt-parent-watchdog", daemon=True).start()


class _DieWithParent:
    """Picklable wrapper of a process target (``spawn`` pickles it into the child)."""

    def __init__(self, target: Callable[..., Any], parent_pid: int, pdeathsig: bool) -> None:
        self.target, self.parent_pid, self.pdeathsig = target, parent_pid, pdeathsig

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        die_with_parent(self.parent_pid, pdeathsig=self.pdeathsig)
        return self.target(*args, **kwargs)


def _start(self: multiprocessing.process.BaseProcess) -> None:
    target = getattr(self, "_target", None)
    if target is not None and not isinstance(target, _DieWithParent):
        self._target = _DieWithParent(
            target, os.getpid(), threading.current_thread() is threading.main_thread())
    assert _original_start is not None
    return _original_start(self)


def install_child_reaper() -> bool:
    """Patch ``BaseProcess.start``; returns False if it already was (idempotent)."""
    global _original_start
    if _original_start is not None:
        return False
    _original_start = multiprocessing.process.BaseProcess.start
    multiprocessing.process.BaseProcess.start = _start
    return True


def uninstall_child_reaper() -> None:
    """Undo :func:`install_child_reaper` (children already started keep their guards)."""
    global _original_start
    if _original_start is not None:
        multiprocessing.process.BaseProcess.start = _original_start
        _original_start = None
