"""One way to disk: the atomic file write and the one writability rule every tool uses.

* :func:`atomic_path` / :func:`write_text`: a file is written to ``PATH.tmp-PID`` beside it,
  ``fsync``-ed, renamed over ``PATH`` and the directory ``fsync``-ed, so ``PATH`` holds its old
  or its new content at every instant (a full disk, a signal or a crash leaves no half file);
  the temporary is removed on any failure. :func:`remove_stale_temporaries` removes the
  ``PATH.tmp-PID`` of killed processes.
* :func:`check_writable`: an output's directory must take a new entry, tried with a real
  create (``os.access`` says yes to root on a read-only mount), before any work is done.

Whole output *directories* are made atomic by
:func:`megatron_endprompt.conversion.output.atomic_output_dir`, and the ``.bin/.idx/.endprompt``
set of a prefix by :class:`megatron_endprompt.data.prepare.atomic_output.PrefixWriter` (a journal),
both on these primitives' rules.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import tempfile
from collections.abc import Iterator

from megatron_endprompt.errors import UserError

__all__ = ["atomic_path", "check_writable", "fsync_dir", "pid_alive",
           "remove_stale_temporaries", "temporary_name", "writable_ancestor", "write_text"]

_TMP_RE = re.compile(r"\.tmp-(\d+)$")


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_dir(directory: str) -> None:
    """``fsync`` a directory, so a rename in it survives a power loss (best effort: some file
    systems refuse ``fsync`` on directories)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temporary_name(path: str) -> str:
    """``PATH.tmp-PID``: the temporary :func:`atomic_path` writes."""
    return f"{path}.tmp-{os.getpid()}"


def remove_stale_temporaries(path: str) -> list[str]:
    """Remove ``PATH.tmp-PID`` left by processes that no longer exist; returns them."""
    removed = []
    for stale in glob.glob(glob.escape(path) + ".tmp-*"):
        m = _TMP_RE.search(stale)
        if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
            with contextlib.suppress(OSError):
                os.unlink(stale)
                removed.append(stale)
    return removed


@contextlib.contextmanager
def atomic_path(path: str, *, fsync: bool = True) -> Iterator[str]:
    """Yield the temporary to write ``path``'s new content to; on success it is ``fsync``-ed
    and renamed over ``path`` (then the directory ``fsync``-ed), on any error removed, so
    ``path`` keeps its previous content. ``fsync=False``: rename only (caches, scratch)."""
    tmp = temporary_name(path)
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if fsync:
            fsync_dir(os.path.dirname(os.path.abspath(path)))
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_text(path: str, text: str, *, fsync: bool = True) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path, fsync=fsync) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def writable_ancestor(directory: str) -> str:
    """The nearest existing ancestor of ``directory`` (itself included), after checking that
    it takes a new entry (a real ``mkdtemp`` + ``rmdir``: nothing is left behind). Raises the
    ``OSError`` of the failed create."""
    probe = os.path.abspath(directory)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    os.rmdir(tempfile.mkdtemp(prefix=".probe-", dir=probe))
    return probe


def check_writable(path: str, *, flag: str, create: bool = False) -> None:
    """Refuse, before any work, an output ``path`` whose directory cannot take a new entry.

    ``create``: make the directory first (tools whose output directory is implied, e.g. an
    evaluation's results file); otherwise the nearest existing ancestor is probed
    (:func:`writable_ancestor`), so nothing is left behind by the check."""
    directory = os.path.dirname(os.path.abspath(path))
    probe = directory
    try:
        if create:
            os.makedirs(directory, exist_ok=True)
        while not os.path.exists(probe):
            probe = os.path.dirname(probe)
        writable_ancestor(probe)
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot write in {probe} ({exc.strerror}); choose a "
                        "writable location") from None
