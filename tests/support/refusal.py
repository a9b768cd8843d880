"""The bad-input promise as one assertion: a refused run prints exactly one ``error:`` line, exits
with the expected code, writes nothing and leaves every input byte-identical.

"Nothing written" and "inputs intact" are checked the same way: the directories a test names
(its inputs' and its outputs') are digested before and after the run, hidden entries included,
so a temporary, a lock file, a hidden ``.partial`` directory or a changed input all show up as a
difference.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["assert_refused", "tree_digest"]


def tree_digest(root: str | os.PathLike, ignore: tuple[str, ...] = ()) -> dict[str, str]:
    """``relative path -> sha256`` of every file under ``root`` (``"dir"`` for directories,
    ``"link:TARGET"`` for symbolic links), but for the top-level entries named in ``ignore`` and
    all below them; a file ``root`` digests as ``{".": sha256}``."""
    root = os.fspath(root)
    if not os.path.isdir(root):
        with open(root, "rb") as f:
            return {".": hashlib.sha256(f.read()).hexdigest()}
    out = {}
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(parent, name)
            rel = os.path.relpath(path, root)
            if rel.split(os.sep)[0] in ignore:
                continue
            if os.path.islink(path):
                out[rel] = "link:" + os.readlink(path)
            elif os.path.isdir(path):
                out[rel] = "dir"
            else:
                with open(path, "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
    return out


def assert_refused(run_tool: Callable, main: Callable, argv: list[Any], *needles: str,
                   watch: Iterable[str | os.PathLike] = (), code: int = 2,
                   absent: Iterable[str] = ()) -> str:
    """Run ``main(argv)`` through the ``run_tool`` fixture and assert the refusal: exit
    ``code``, one ``error:`` line on stderr containing every ``needle``, no traceback, every
    ``watch`` directory (or file) unchanged, and no ``absent`` text in the line (a flag the
    user never gave). Returns the line."""
    watch = [os.fspath(w) for w in watch]
    before = {w: tree_digest(w) for w in watch}
    rc, out, err = run_tool(main, argv)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == code, (rc, out[-2000:], err[-2000:])
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    for text in absent:
        assert text not in lines[0], (text, lines[0])
    for w in watch:
        assert tree_digest(w) == before[w], f"{w} changed (a file written, moved or damaged)"
    return lines[0]
