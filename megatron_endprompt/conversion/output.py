"""All-or-nothing output directories: write into a hidden sibling, rename at the end.

The sibling comes from ``tempfile.mkdtemp`` (mode 0700) and some writers create files 0600, so
before the rename every directory gets ``0777 & ~umask`` and every file ``0666 & ~umask`` (0755 /
0644 under the usual umask 022): the output is as readable as anything else the user creates.

The sibling is ``.OUT.partial-PID-XXXX``: a ``SIGKILL`` leaves it behind (hundreds of MB for a
real model), so the next run with the same ``--output`` removes those of dead processes.

:func:`guarded_output` holds the output for a whole run: it refuses an output that is, contains
or lies inside an input (the final rename would delete it), and locks ``.OUT.lock`` beside it
so a second run to the same ``--output`` stops at once instead of both printing "wrote" and
the later rename silently replacing the earlier output.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from megatron_endprompt.disk import check_apart, check_writable, exclusive, fsync_dir, pid_alive
from megatron_endprompt.errors import UserError

__all__ = ["apply_umask", "atomic_output_dir", "check_output", "check_output_name", "check_finite",
           "guarded_output", "remove_stale_partials"]

_PARTIAL_RE = re.compile(r"\.partial-(\d+)-[^/]*$")


def check_output_name(path: str, *, flag: str = "--output") -> None:
    """Refuse an output named ``''``, ``.``, ``..`` (or ending in ``/.``, ``/..``) or the root:
    the output is built beside its name and renamed onto it, so such a name would build the
    export in a hidden sibling of the current directory and then fail to rename (or replace the
    directory the user stands in)."""
    last = os.path.basename(path.rstrip(os.sep)) if path.strip(os.sep) else path
    if last in ("", ".", "..") or path.startswith(os.sep) and not path.strip(os.sep):
        raise UserError(f"{flag} {path!r} names no new directory; give the directory to "
                        f"create, e.g. {flag} {os.path.join(path or '.', 'export')}")


def check_output(path: str, *, overwrite: bool, flag: str = "--output") -> None:
    """Refuse a name that is no directory of its own (:func:`check_output_name`), an existing
    ``path`` unless ``overwrite``, and an unwritable parent (before any work is done)."""
    check_output_name(path, flag=flag)
    if os.path.lexists(path) and not overwrite:
        raise UserError(f"{flag} {path} already exists; pass --overwrite to replace it")
    check_writable(path, flag=flag)


@contextlib.contextmanager
def guarded_output(path: str, *, inputs: list[tuple[str, str]], overwrite: bool,
                   flag: str = "--output") -> Iterator[None]:
    """For the duration of a run writing ``path``: ``path`` apart from every ``(flag, input)``
    (:func:`~megatron_endprompt.disk.check_apart`), :func:`check_output`, and the lock
    ``.OUT.lock`` beside it held (a second run -> one ``error:`` line)."""
    check_output_name(path, flag=flag)
    check_apart(path, inputs, flag=flag)
    check_output(path, overwrite=overwrite, flag=flag)
    name = os.path.basename(os.path.abspath(path))
    lock = os.path.join(os.path.dirname(os.path.abspath(path)), f".{name}.lock")
    with exclusive(lock, busy=f"{flag} {path}: another run (pid {{pid}}) is writing it; wait "
                              f"for that run to finish or choose another {flag}"):
        yield


def check_finite(tensor: Any, what: str) -> None:
    """Refuse a tensor with NaN or infinite values (a diverged run): one line naming it."""
    import torch

    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise UserError(f"{what} has {bad} non-finite value(s) (NaN/inf): the training run "
                        "diverged; convert an earlier checkpoint (e.g. the iter_* before the "
                        "loss became nan)")


def remove_stale_partials(path: str) -> list[str]:
    """Remove ``.OUT.partial-PID-*`` siblings of ``path`` whose process no longer exists."""
    parent = os.path.dirname(os.path.abspath(path))
    pattern = os.path.join(glob.escape(parent),
                           f".{glob.escape(os.path.basename(os.path.abspath(path)))}.partial-*")
    removed = []
    for p in glob.glob(pattern):
        m = _PARTIAL_RE.search(p)
        if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
            if "-old-" in os.path.basename(p) and not os.path.lexists(path):
                os.replace(p, path)  # killed between the two renames: put the old output back
                continue
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(root: str) -> None:
    """Give ``root`` and everything below it the modes a plain ``mkdir``/``open`` would have
    under the process umask (directories ``0777 & ~umask``, files ``0666 & ~umask``)."""
    mask = _umask()
    os.chmod(root, 0o777 & ~mask)
    for parent, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(parent, name), 0o777 & ~mask)
        for name in files:
            path = os.path.join(parent, name)
            if not os.path.islink(path):
                os.chmod(path, 0o666 & ~mask)


@contextlib.contextmanager
def atomic_output_dir(path: str, *, overwrite: bool, flag: str = "--output") -> Iterator[str]:
    """Yield a fresh temporary directory next to ``path``; on success it replaces ``path``
    (only if ``overwrite``), on any error it is removed, so no partial output is left."""
    check_output(path, overwrite=overwrite, flag=flag)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    remove_stale_partials(path)
    tmp = tempfile.mkdtemp(
        prefix=f".{os.path.basename(os.path.abspath(path))}.partial-{os.getpid()}-",
        dir=parent)
    try:
        yield tmp
        apply_umask(tmp)
        if os.path.lexists(path) and not overwrite:  # appeared during the run: never replaced
            raise UserError(f"{flag} {path} appeared while this run was writing (another "
                            "run?); nothing was replaced: pass --overwrite to replace it")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if os.path.lexists(path):  # move the old output aside first: replaced in two renames
        old = tempfile.mktemp(prefix=f".{os.path.basename(os.path.abspath(path))}.partial-"
                                     f"{os.getpid()}-old-", dir=parent)
        try:
            os.replace(path, old)
        except BaseException:  # the old output stays where it was; the new one is dropped
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    try:
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:  # put the old output back
            os.replace(old, path)
        raise
    fsync_dir(parent)
    if old is not None:
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.remove(old)
