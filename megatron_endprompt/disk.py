"""One way to disk: the atomic file write and the one writability rule every tool uses.

* :func:`atomic_path` / :func:`write_text`: a file is written to ``PATH.tmp-PID`` beside it,
  ``fsync``-ed, renamed over ``PATH`` and the directory ``fsync``-ed, so ``PATH`` holds its old
  or its new content at every instant (a full disk, a signal or a crash leaves no half file);
  the temporary is removed on any failure. :func:`remove_stale_temporaries` removes the
  ``PATH.tmp-PID`` of killed processes.
* :func:`check_writable`: an output's directory must take a new entry, tried with a real
  create (``os.access`` says yes to root on a read-only mount), before any work is done.
* :func:`check_apart`: an output that is, contains or lies inside one of the run's inputs is
  refused, comparing files (device + inode, through symlinks and ``..``), never strings: a
  replace-on-success output would otherwise delete the input it was made from.
* :func:`exclusive`: a ``fcntl.flock`` lock file held for a whole run, so a second run writing
  the same output stops at once instead of replacing the first one's work.

Whole output *directories* are made atomic by
:func:`megatron_endprompt.conversion.output.atomic_output_dir`, and the ``.bin/.idx/.endprompt``
set of a prefix by :class:`megatron_endprompt.data.prepare.atomic_output.PrefixWriter` (a journal),
both on these primitives' rules.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import re
import tempfile
import time
from collections.abc import Iterator

from megatron_endprompt.errors import UserError

__all__ = ["atomic_path", "check_apart", "check_writable", "exclusive", "fsync_dir", "naming",
           "pid_alive",
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
def naming(path: str) -> Iterator[None]:
    """Give ``path`` to an ``OSError`` raised inside without a file name: ``write``, ``flush``
    and ``fsync`` of an open file name none, so a full disk would otherwise be reported as
    "the output" instead of the file that could not be written."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, path) from None


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


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _existing_chain(path: str) -> list[tuple[int, int]]:
    """Identities of ``path`` (if it exists) and of every existing ancestor, symlinks
    resolved (``realpath``), so ``a/link/..`` and bind mounts compare as what they are."""
    chain, probe = [], os.path.realpath(path)
    while True:
        ident = _identity(probe)
        if ident is not None:
            chain.append(ident)
        parent = os.path.dirname(probe)
        if parent == probe:
            return chain
        probe = parent


def check_apart(output: str, inputs: list[tuple[str, str]], *, flag: str = "--output") -> None:
    """Refuse an ``output`` that is, contains or lies inside one of ``inputs`` (``(flag,
    path)`` pairs; missing inputs are skipped: their own check names them). Replacing such an
    output deletes the input, and writing inside an input changes it."""
    out_id = _identity(output)
    out_chain = _existing_chain(output)
    for in_flag, path in inputs:
        in_id = _identity(path)
        if in_id is None:
            continue
        if out_id == in_id:
            relation = "is"
        elif out_id is not None and out_id in _existing_chain(path)[1:]:
            relation = "contains"
        elif in_id in out_chain:
            relation = "lies inside"
        else:
            continue
        raise UserError(f"{flag} {output} {relation} the input {in_flag} {path}; writing it "
                        f"would destroy that input: choose an {flag} outside it")


@contextlib.contextmanager
def exclusive(lock_path: str, *, busy: str, who: str = "", wait_s: float = 0.0,
              make_parents: bool = True) -> Iterator[None]:
    """Hold ``lock_path`` with ``fcntl.flock`` for the duration: the package's one file lock
    (a dataset prefix's ``PREFIX.lock``, a conversion output's ``.OUT.lock``).

    Another holder -> one :class:`UserError` ``busy`` (``{pid}`` in it replaced by the holder's
    pid), after polling up to ``wait_s`` seconds. ``who`` (e.g. ``--output-prefix data/ep``)
    starts the other refusals: a lock path that is a link (never opened through: truncating it
    would empty the file it names) or a directory that takes no new file. The file records our
    pid and is removed on release (the inode check makes a create/unlink race with a releasing
    holder safe). On a full disk (recording the pid fails) the lock file is removed and the
    ``OSError`` names it. ``make_parents``: create the lock's missing directories (removed again
    if they stay empty); else a missing directory is refused like an unwritable one (a dataset
    prefix must name an existing directory)."""
    start = f"{who}: " if who else ""
    parent = os.path.dirname(os.path.abspath(lock_path))
    made = []
    probe = parent
    while make_parents and not os.path.exists(probe):
        made.append(probe)
        probe = os.path.dirname(probe)
    deadline = time.monotonic() + wait_s
    try:
        try:
            if make_parents:
                os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise UserError(f"{start}cannot create {parent} ({exc.strerror}); choose an "
                            "existing, writable directory") from None
        fd = _take_lock(lock_path, busy=busy, start=start, deadline=deadline)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # a full disk: no lock file left behind, and the file named
            with contextlib.suppress(OSError):
                os.unlink(lock_path)
            os.close(fd)
            raise OSError(exc.errno, exc.strerror, lock_path) from None
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.unlink(lock_path)
            os.close(fd)
    finally:
        for directory in made:  # deepest first
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def _take_lock(lock_path: str, *, busy: str, start: str, deadline: float) -> int:
    """The descriptor of ``lock_path``, open and ``flock``-ed by us (:func:`exclusive`)."""
    while True:
        try:  # never through a link: truncating it would empty the file it names
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UserError(f"{start}{lock_path} is a symbolic link; it is this tool's lock "
                                "file: remove the link") from None
            raise UserError(f"{start}cannot write in {os.path.dirname(os.path.abspath(lock_path))}"
                            f" ({exc.strerror}); choose an existing, writable directory") from None
        if os.fstat(fd).st_nlink > 1:
            os.close(fd)
            raise UserError(f"{start}{lock_path} is another name of an existing file (a hard "
                            "link); it is this tool's lock file: remove that name")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            if time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            raise UserError(busy.replace("{pid}", holder)) from None
        st = os.fstat(fd)
        if _identity(lock_path) != (st.st_dev, st.st_ino):
            os.close(fd)  # the previous holder removed it between our open and flock
            continue
        return fd
