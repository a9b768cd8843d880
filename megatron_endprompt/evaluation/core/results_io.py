"""Results that survive: the output is checked writable before the model loads, results are
written as each task/length finishes, and non-finite numbers (a NaN model) become ``null`` with
one warning instead of losing the whole evaluation to ``allow_nan=False``.

Also where a run writes (``output_paths``) and the promise that writing never touches an input
(``check_outputs_apart``: every output apart from every input and from each other, checked
before anything is opened).
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
           "write_json_now", "output_paths", "check_outputs_apart"]


def check_writable(path: str, *, flag: str = "--output", create: bool = True) -> None:
    """Refuse an output file whose directory cannot be created or written (before any work).

    ``create=False`` probes the nearest existing ancestor and leaves nothing behind: the
    evaluation checks its outputs this way and creates their directory only once every other
    input has been validated (a refused run leaves no empty output directory)."""
    if os.path.isdir(path):
        raise UserError(f"{flag} {path} is a directory; give a file path, e.g. "
                        f"{os.path.join(path, 'results.json')}")
    disk.check_writable(path, flag=flag, create=create)


def output_paths(json_path: str) -> dict[str, str]:
    """``FILE.json`` -> the paths of the JSON, markdown and PNG outputs."""
    base = json_path[:-5] if json_path.endswith(".json") else json_path
    return {"json": json_path if json_path.endswith(".json") else base + ".json",
            "md": base + ".md", "niah_png": base + "_niah.png", "ppl_png": base + "_ppl.png"}


def check_outputs_apart(outputs: list[tuple[str, str]], inputs: list[tuple[str, str]]) -> None:
    """Refuse (``UserError``) an output that is, contains or lies inside an input
    (:func:`megatron_endprompt.disk.check_apart`: replacing it would destroy the input), or
    that is, contains or lies inside another output (one would overwrite the other). Outputs
    and inputs are ``(flag, path)`` pairs; outputs are compared by their resolved paths, as
    they need not exist yet."""
    for flag, path in outputs:
        disk.check_apart(path, inputs, flag=flag)
    resolved = [(flag, path, os.path.realpath(path)) for flag, path in outputs]
    for i, (flag_a, a, real_a) in enumerate(resolved):
        for flag_b, b, real_b in resolved[i + 1:]:
            if real_a == real_b:
                relation = "is"
            elif real_b.startswith(real_a + os.sep):
                relation = "contains"
            elif real_a.startswith(real_b + os.sep):
                relation = "lies inside"
            else:
                continue
            raise UserError(f"{flag_a} {a} {relation} {flag_b} {b}; one would overwrite the "
                            f"other: give {flag_a} a path of its own")


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
