"""All-or-nothing output directories: write into a hidden sibling, rename at the end.

The sibling comes from ``tempfile.mkdtemp`` (mode 0700) and some writers create files 0600, so
before the rename every directory gets ``0777 & ~umask`` and every file ``0666 & ~umask`` (0755 /
0644 under the usual umask 022): the output is as readable as anything else the user creates.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from megatron_endprompt.errors import UserError

__all__ = ["apply_umask", "atomic_output_dir", "check_output"]


def check_output(path: str, *, overwrite: bool, flag: str = "--output") -> None:
    """Refuse an existing ``path`` unless ``overwrite`` (before any work is done)."""
    if os.path.lexists(path) and not overwrite:
        raise UserError(f"{flag} {path} already exists; pass --overwrite to replace it")


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
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(path))}.partial-",
                           dir=parent)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    apply_umask(tmp)
    if os.path.lexists(path):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    os.replace(tmp, path)
