"""All-or-nothing output directories: write into a hidden sibling, rename at the end."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from megatron_endprompt.errors import UserError

__all__ = ["atomic_output_dir", "check_output"]


def check_output(path: str, *, overwrite: bool, flag: str = "--output") -> None:
    """Refuse an existing ``path`` unless ``overwrite`` (before any work is done)."""
    if os.path.lexists(path) and not overwrite:
        raise UserError(f"{flag} {path} already exists; pass --overwrite to replace it")


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
    if os.path.lexists(path):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    os.replace(tmp, path)
