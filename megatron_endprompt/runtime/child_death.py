"""Child processes of a training rank exit with it.

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
``Manager`` processes are all covered). It goes through the runtime's ledger:
``runtime.install(trainer=True)`` (the pretrain entry) installs it and ``runtime.uninstall()``
undoes it; :func:`install_child_reaper` without a ledger records it in this module's own,
undone by :func:`uninstall_child_reaper`.
"""

from __future__ import annotations

import ctypes
import multiprocessing.process
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from megatron_endprompt.runtime.ledger import Ledger

__all__ = ["install_child_reaper", "uninstall_child_reaper", "die_with_parent"]

_PR_SET_PDEATHSIG = 1
_PATCH = "child-reaper"
_own = Ledger()
"""The ledger of :func:`install_child_reaper` called without one."""


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


def _guarded_start(original: Callable[..., Any]) -> Callable[..., Any]:
    """``BaseProcess.start`` that first wraps the process target in :class:`_DieWithParent`."""

    def start(self: multiprocessing.process.BaseProcess) -> None:
        target = getattr(self, "_target", None)
        if target is not None and not isinstance(target, _DieWithParent):
            self._target = _DieWithParent(
                target, os.getpid(), threading.current_thread() is threading.main_thread())
        return original(self)

    start.endprompt_child_reaper = True  # type: ignore[attr-defined]
    return start


def install_child_reaper(ledger: Ledger | None = None) -> bool:
    """Patch ``BaseProcess.start`` through ``ledger`` (default: this module's own); returns
    False if it already was (idempotent)."""
    owner = multiprocessing.process.BaseProcess
    if getattr(owner.start, "endprompt_child_reaper", False):
        return False
    (_own if ledger is None else ledger).replace(owner, "start", _guarded_start(owner.start),
                                                 patch=_PATCH)
    return True


def uninstall_child_reaper() -> None:
    """Undo :func:`install_child_reaper` called without a ledger (children already started keep
    their guards)."""
    _own.restore()
