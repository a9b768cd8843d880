"""Items of a local benchmark JSONL file (LongBench, HumanEval, ...), read the one way: blank
lines skipped, every line a JSON object with the benchmark's fields, the first ``limit`` kept,
and every defect (not UTF-8, not JSON, a field missing) one :class:`UserError` naming the flag,
the file and the line."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from megatron_endprompt.errors import UserError

__all__ = ["read_items"]


def read_items(path: str, *, fields: Sequence[str], flag: str, benchmark: str, noun: str,
               limit: int = 0, extra_check: Callable[[dict[str, Any]], str | None] | None = None
               ) -> list[dict[str, Any]]:
    """The items of ``path``. ``extra_check(item)`` returns a field description to refuse the
    line with (e.g. ``"answers (a list)"``), or ``None``."""
    items: list[dict[str, Any]] = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"{flag}: {path} line {n} is not UTF-8 text (byte "
                                f"{exc.start}: {exc.reason}); save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{flag}: {path} line {n} is not JSON ({exc.msg})") from None
            missing = [k for k in fields if not isinstance(item, dict) or k not in item]
            bad = None if missing else (extra_check(item) if extra_check else None)
            if missing or bad:
                raise UserError(f"{flag}: {path} line {n} lacks {benchmark} field(s) "
                                f"{', '.join(missing) or bad}")
            items.append(item)
            if limit and len(items) == limit:
                break
    if not items:
        raise UserError(f"{flag}: {path} has no {noun}")
    return items
