"""User-facing errors: one clear line naming the file or flag and the fix, no traceback."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator


class UserError(Exception):
    """Bad input from the user. Command-line tools print ``error: <message>`` and exit 2."""


@contextlib.contextmanager
def user_errors(prefix: str = "") -> Iterator[None]:
    """Report a ``ValueError`` raised inside (an option class or a config validating its
    values) as a :class:`UserError` with the same message, after ``prefix``: the one re-wrap
    every tool and library entry uses."""
    try:
        yield
    except ValueError as exc:
        raise UserError(f"{prefix}{exc}") from None


class Terminated(BaseException):
    """Raised in the main thread on ``SIGTERM`` (what schedulers send before ``SIGKILL``), so
    ``finally`` blocks remove temporaries exactly as for Ctrl-C; the tool exits 143."""


#: I/O failures of the environment (not bugs): reported as one line naming the file.
_ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                       errno.EFBIG, errno.EIO}


def io_error_line(exc: OSError) -> str:
    """``cannot write /x/y: No space left on device; free space or ...`` for an ``OSError``."""
    where = exc.filename or "the output"
    hint = {errno.ENOSPC: "free disk space or choose another output location",
            errno.EDQUOT: "free quota or choose another output location",
            errno.EFBIG: "the file exceeds the file-size limit; raise it (ulimit -f) or "
                         "choose another location"}.get(exc.errno,
                                                        "choose a writable output location")
    return f"{where}: {exc.strerror or os.strerror(exc.errno or 0)}; {hint}"


def _on_sigterm(signum, frame):  # noqa: ARG001 - signal handler signature
    if os.getpid() != _on_sigterm.pid:  # a forked worker: die as the default action would
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise Terminated()


_on_sigterm.pid = os.getpid()


def install_sigterm_handler() -> Callable[[], None]:
    """Make ``SIGTERM`` raise :class:`Terminated` in this (main) process; returns the undo.
    Forked workers that inherit the handler still die at once with the default action."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    _on_sigterm.pid = os.getpid()
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    return lambda: signal.signal(signal.SIGTERM, previous)


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run a tool's ``main``; turn :class:`UserError` (and config ``ValueError``s raised while
    validating flags, wrapped as UserError by the tool) into one line on stderr and exit 2.
    ``SIGINT``/``SIGTERM`` unwind the tool (temporaries removed) and exit 130/143; a full disk
    or a read-only output is one line, exit 2."""
    restore = install_sigterm_handler()
    try:
        return int(main(argv) or 0)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in _ENVIRONMENT_ERRNOS:
            raise
        print(f"error: {io_error_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; no output was finalised", file=sys.stderr)
        return 130
    except Terminated:
        print("error: terminated (SIGTERM); temporaries removed, no output was finalised",
              file=sys.stderr)
        return 143
    finally:
        restore()
