"""Why Megatron's checkpoint writer failed, as the ``OSError`` it was (a full disk: one line).

``dist_checkpointing.save`` writes through Megatron's ``FileSystemWriterAsync``. Its worker
catches the write's exception and *returns* it; the caller then fails an ``assert`` on the
result type and re-raises ``RuntimeError("Worker failure: ... error: <class 'OSError'>")``:
the errno is gone from the exception chain. What survives is the worker's own ERROR log line
(``Local worker 0 encountered an error: [Errno 28] No space left on device``), and, when the
disk filled inside ``torch.save``'s zip writer (``unexpected pos 704 vs 598``: a short write,
no errno at all), the file system itself, which is still full when the failure arrives.

:func:`writer_errors` collects those log lines for the duration of a save (and keeps them off
stderr: the tool prints one line); :func:`writer_os_error` finds the ``OSError`` from, in order,
the exception chain, the logged lines and a free-space probe of the output.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
from collections.abc import Iterator

__all__ = ["WRITER_LOGGER", "os_error_inside", "writer_errors", "writer_os_error"]

#: The logger of Megatron's asynchronous file-system writer (its worker errors go there).
WRITER_LOGGER = "megatron.core.dist_checkpointing.strategies.filesystem_async"

#: Below this many free bytes a write failure with no errno is taken for a full disk.
FULL_DISK_BYTES = 64 << 20

_ERRNO_RE = re.compile(r"\[Errno (\d+)\]")
#: Worker failures that are a short or failed write (torch's zip writer, a lost ``OSError``).
_WRITE_FAILURE_RE = re.compile(r"unexpected pos \d+ vs \d+|file write failed|<class 'OSError'>")


class _Collect(logging.Handler):
    """Keeps the text of every record at ERROR or above."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def writer_errors() -> Iterator[list[str]]:
    """Yield the list the writer's ERROR log lines are appended to while the block runs; they
    do not propagate to the root logger meanwhile (a failed save is reported in one line, an
    unexplained one carries them as notes of its exception)."""
    log = logging.getLogger(WRITER_LOGGER)
    handler, propagate = _Collect(), log.propagate
    log.addHandler(handler)
    log.propagate = False
    try:
        yield handler.messages
    finally:
        log.removeHandler(handler)
        log.propagate = propagate


def os_error_inside(exc: BaseException) -> OSError | None:
    """The ``OSError`` a checkpoint writer's exception wraps (torch's ``CheckpointException``
    holding per-rank failures, Megatron's ``RuntimeError("Worker failure: ...")`` raised from
    the worker's error, or only its text ``[Errno 28] ...``), named after the errno; ``None``
    when it wraps none."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno:
            return e
        todo += [e.__cause__, e.__context__]
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo += [v[0] if isinstance(v, tuple) else v for v in failures.values()]
        found = _errno_in(str(e))
        if found is not None:
            return found
    return None


def _errno_in(text: str) -> OSError | None:
    m = _ERRNO_RE.search(text)
    if m is None:
        return None
    code = int(m.group(1))
    return OSError(code, os.strerror(code) if code in errno.errorcode else text)


def _free_bytes(directory: str) -> int | None:
    probe = os.path.abspath(directory)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:
        st = os.statvfs(probe)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def writer_os_error(exc: BaseException, logged: list[str], directory: str) -> OSError | None:
    """The ``OSError`` behind a failed save into ``directory``: from the exception chain, the
    writer's logged lines (:func:`writer_errors`), or -- a write failure with no errno while
    ``directory``'s file system has under :data:`FULL_DISK_BYTES` free -- ``ENOSPC``."""
    found = os_error_inside(exc)
    for text in logged:
        found = found or _errno_in(text)
    if found is not None:
        return found
    texts = [str(exc), *logged]
    free = _free_bytes(directory)
    if any(_WRITE_FAILURE_RE.search(t) for t in texts) and free is not None \
            and free < FULL_DISK_BYTES:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return None
