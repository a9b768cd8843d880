"""The ledger of every attribute the runtime replaced in torch or Megatron, and the check that a
patched function is still the one its patch was written for.

Every patch goes through :meth:`Ledger.replace`, which records ``(owner, name, original)`` so
:meth:`Ledger.restore` can put the originals back (``runtime.uninstall()``), and — when the patch
names an expected *fingerprint* — first compares the original's fingerprint with it. The
fingerprint is a short hash of the function's syntax tree with docstrings removed, so comments,
formatting and docstrings may change between Megatron releases, code may not: a Megatron change
under a patch fails loudly with one line instead of silently running a stale patch.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Union

__all__ = ["Expected", "Ledger", "PatchedFunctionChanged", "fingerprint"]

#: What a patch accepts: one fingerprint, or ``{reviewed Megatron-Core version: fingerprint}``
#: (a function that differs between releases the patch was checked against), or ``None``
#: (only the attribute must exist).
Expected = Union[str, Mapping[str, str], None]

_MISSING = object()


class PatchedFunctionChanged(RuntimeError):
    """A function the runtime patches is not the code the patch was written for."""


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(
                    getattr(body[0], "value", None), ast.Constant) and isinstance(
                    body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def fingerprint(fn: Any) -> str:
    """12 hex digits identifying ``fn``'s code: sha256 of its AST without docstrings (comments
    and layout do not count). Functions without Python source (C builtins) hash their
    signature, or their qualified name when even that is unavailable."""
    fn = inspect.unwrap(fn)
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        text = ast.dump(_strip_docstrings(ast.parse(source)), include_attributes=False)
    except (OSError, TypeError, SyntaxError):
        try:
            text = f"{getattr(fn, '__qualname__', fn)!s}{inspect.signature(fn)}"
        except (TypeError, ValueError):
            text = repr(getattr(fn, "__qualname__", fn))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _describe(owner: Any, name: str) -> str:
    module = getattr(owner, "__module__", None) if not inspect.ismodule(owner) else None
    base = owner.__name__ if hasattr(owner, "__name__") else type(owner).__name__
    return f"{module + '.' if module else ''}{base}.{name}"


@dataclass(frozen=True)
class _Entry:
    owner: Any
    name: str
    original: Any
    patch: str


class Ledger:
    """Replacements made by one layer of the runtime, restorable in reverse order."""

    def __init__(self) -> None:
        self._entries: list[_Entry] = []

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[tuple[str, str]]:
        """``[(patch, "module.Owner.attr"), ...]`` in the order applied (for humans, tests)."""
        return [(e.patch, _describe(e.owner, e.name) if e.owner is not None else "(undo)")
                for e in self._entries]

    def check(self, owner: Any, name: str, expected: Expected, *, patch: str) -> Any:
        """Return ``owner.name``; raise :class:`PatchedFunctionChanged` (one line) when its
        fingerprint is not ``expected`` (any of a mapping's). ``None`` only checks it exists."""
        current = getattr(owner, name, _MISSING)
        where = _describe(owner, name)
        if current is _MISSING:
            raise PatchedFunctionChanged(
                f"megatron_endprompt.runtime: patch {patch!r} needs {where}, which this "
                "installation lacks; update megatron_endprompt/runtime for it")
        if expected is None:
            return current
        accepted = dict(expected) if isinstance(expected, Mapping) else {"": expected}
        if (got := fingerprint(current)) not in accepted.values():
            written = ", ".join(f"{fp} ({v})" if v else fp for v, fp in accepted.items())
            raise PatchedFunctionChanged(
                f"megatron_endprompt.runtime: {where} changed (fingerprint {got}, patch "
                f"{patch!r} was written for {written}); re-check the patch against the "
                "installed Megatron-Core and update megatron_endprompt/runtime")
        return current

    def replace(self, owner: Any, name: str, value: Any, *, patch: str,
                expected: Expected = None, must_exist: bool = True) -> Any:
        """``owner.name = value``, remembering the original; returns the original.

        ``expected``: fingerprint the original must have (see :func:`fingerprint`);
        ``must_exist=False`` allows adding an attribute this torch/Megatron build lacks.
        """
        if must_exist or expected is not None:
            original = self.check(owner, name, expected, patch=patch)
        else:
            original = getattr(owner, name, _MISSING)
        try:
            own = name in vars(owner)
        except TypeError:  # no __dict__: the attribute is the owner's own
            own = True
        # An attribute found on a base class (or an instance's class) is deleted again on
        # restore rather than copied onto ``owner``, so lookups fall through exactly as before.
        self._entries.append(_Entry(owner, name, original if own else _MISSING, patch))
        setattr(owner, name, value)
        return original

    def remember(self, owner: Any, name: str, *, patch: str) -> None:
        """Record ``owner.name`` (e.g. a list about to be mutated in place via a copy) without
        replacing it now; :meth:`restore` puts the recorded value back."""
        value = getattr(owner, name)
        self._entries.append(_Entry(owner, name, list(value) if isinstance(value, list)
                                    else value, patch))

    def on_restore(self, undo: Any, *, patch: str) -> None:
        """Call ``undo()`` when restoring (for state that is not an attribute, e.g. a torch
        function mode pushed on this thread's stack)."""
        self._entries.append(_Entry(None, "", undo, patch))

    def restore(self) -> int:
        """Put every original back (last patch first); returns how many were restored."""
        n = len(self._entries)
        while self._entries:
            e = self._entries.pop()
            if e.owner is None:
                e.original()
            elif e.original is _MISSING:
                try:
                    delattr(e.owner, e.name)
                except AttributeError:
                    pass
            else:
                setattr(e.owner, e.name, e.original)
        return n
