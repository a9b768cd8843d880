"""Results that survive: the output is checked writable before the model loads, results are
written as each task/length finishes, and non-finite numbers (a NaN model) become ``null`` with
one warning instead of losing the whole evaluation to ``allow_nan=False``.

Small on purpose: ``cli/eval.py`` and ``report.write_reports`` call these three functions.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

from megatron_endprompt import disk
from megatron_endprompt.errors import UserError

__all__ = ["check_weights_readable", "check_writable", "finite_or_null", "sanitized",
           "write_json_now"]


def check_writable(path: str, *, flag: str = "--output", create: bool = True) -> None:
    """Refuse an output file whose directory cannot be created or written (before any work).

    ``create=False`` probes the nearest existing ancestor and leaves nothing behind: the
    evaluation checks its outputs this way and creates their directory only once every other
    input has been validated (a refused run leaves no empty output directory)."""
    if os.path.isdir(path):
        raise UserError(f"{flag} {path} is a directory; give a file path, e.g. "
                        f"{os.path.join(path, 'results.json')}")
    disk.check_writable(path, flag=flag, create=create)


def finite_or_null(value: Any, *, where: str = "", found: list[str] | None = None) -> Any:
    """A copy of ``value`` with NaN/inf floats replaced by ``None``; their JSON paths are
    appended to ``found``."""
    if isinstance(value, float) and not math.isfinite(value):
        if found is not None:
            found.append(where or "<root>")
        return None
    if isinstance(value, dict):
        return {k: finite_or_null(v, where=f"{where}.{k}" if where else str(k), found=found)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v, where=f"{where}[{i}]", found=found)
                for i, v in enumerate(value)]
    return value


_warned: set[str] = set()


def sanitized(results: dict[str, Any]) -> dict[str, Any]:
    """:func:`finite_or_null` plus one ``warning:`` line (per distinct set of paths)."""
    found: list[str] = []
    clean = finite_or_null(results, found=found)
    if found:
        key = ",".join(found)
        if key not in _warned:
            _warned.add(key)
            shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4
                                             else "")
            print(f"warning: {len(found)} non-finite value(s) written as null ({shown}); the "
                  "model produced NaN/inf", file=sys.stderr)
    return clean


def write_json_now(results: dict[str, Any], path: str) -> None:
    """Write ``results`` (sanitised) to ``path`` atomically: a later crash keeps what finished."""
    disk.write_text(path, json.dumps(sanitized(results), indent=2, allow_nan=False) + "\n")


def check_weights_readable(hf_dir: str) -> None:
    """Open every ``*.safetensors`` header (memory-mapped, no tensor read): a truncated or
    corrupt file is one line naming it before the model loads, not a ``SafetensorError``
    traceback."""
    from safetensors import safe_open

    for name in sorted(os.listdir(hf_dir)):
        if name.endswith(".safetensors"):
            path = os.path.join(hf_dir, name)
            try:
                with safe_open(path, framework="pt"):
                    pass
            except Exception as exc:  # noqa: BLE001 - SafetensorError has no public base
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise UserError(f"--hf-dir {hf_dir}: {name} is truncated or corrupt ({first}); "
                                "re-download or re-export it") from None
