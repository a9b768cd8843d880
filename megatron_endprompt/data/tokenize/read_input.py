"""JSONL input for preprocessing: files, partitions (byte ranges) and per-line parsing.

A partition ``I`` of ``N`` is a line-aligned byte range of the inputs taken as one
concatenated stream: it owns every line that *starts* in ``[I * S / N, (I + 1) * S / N)``
(``S`` = total bytes), so ``N`` machines each read ``1/N`` of the bytes, no line is read twice
or skipped, and the shards concatenated in order hold exactly the documents of one run.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

from megatron_endprompt.errors import UserError


def expand_inputs(patterns: list[str]) -> list[str]:
    """Files named by ``--input`` (globs allowed), sorted per pattern, each checked readable."""
    paths: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise UserError(f"--input {pattern}: matches no file")
        for p in matches:
            if not os.path.isfile(p) or not os.access(p, os.R_OK):
                raise UserError(f"--input {p}: not a readable file")
            stem, ext = os.path.splitext(p)
            if ext in (".bin", ".idx") and os.path.isfile(stem + ".bin") \
                    and os.path.isfile(stem + ".idx"):
                raise UserError(f"--input {p}: an already tokenized Megatron corpus; give it a "
                                f"sidecar instead: tools/build_endprompt_sidecar.py "
                                f"--data-prefix {stem}")
        paths.extend(matches)
    return paths


@dataclass(frozen=True, kw_only=True)
class InputRange:
    """The bytes of the inputs one process reads (all of them without partitions)."""

    paths: tuple[str, ...]
    sizes: tuple[int, ...]
    start: int
    """Global byte offset (inputs concatenated) of the first line start owned."""
    stop: int
    """Lines starting at or after this global offset belong to the next partition."""

    @property
    def total_bytes(self) -> int:
        return self.stop - self.start


def input_range(paths: list[str], partition: int = 0, partitions: int = 1) -> InputRange:
    sizes = tuple(os.path.getsize(p) for p in paths)
    total = sum(sizes)
    return InputRange(paths=tuple(paths), sizes=sizes, start=total * partition // partitions,
                      stop=total * (partition + 1) // partitions)


def _count_newlines(f, n: int) -> int:
    count, left = 0, n
    while left > 0:
        block = f.read(min(left, 1 << 22))
        if not block:
            break
        count += block.count(b"\n")
        left -= len(block)
    return count


def read_lines(rng: InputRange) -> Iterator[tuple[str, int, bytes]]:
    """``(path, line number, raw line)`` of every line owned by ``rng``, in input order."""
    base = 0
    for path, size in zip(rng.paths, rng.sizes):
        lo, hi = max(rng.start - base, 0), min(rng.stop - base, size)
        base += size
        if lo >= hi:
            continue
        with open(path, "rb") as f:
            lineno = 1
            if lo > 0:
                lineno += _count_newlines(f, lo - 1)
                f.seek(lo - 1)
                if f.read(1) != b"\n":  # lo is inside a line: the previous partition owns it
                    f.readline()
                lineno += 1  # the line that ends at or after lo - 1
            pos = f.tell()
            while pos < hi:
                raw = f.readline()
                if not raw:
                    break
                yield path, lineno, raw
                lineno += 1
                pos += len(raw)


def parse_line(path: str, lineno: int, raw: bytes, keys: list[str]) -> tuple[str, str | None]:
    """``("ok", text)`` or ``(skip_reason, None)``; bad input raises :class:`UserError`."""
    where = f"{path}:{lineno}"
    if not raw.strip():
        return "blank line", None
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{where}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
            "re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8"
        ) from None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        msg = exc.msg.removesuffix(" at")
        raise UserError(f"{where}: malformed JSON ({msg}, column {exc.colno}); "
                        "fix or remove the line") from None
    except RecursionError:  # arrays/objects nested past Python's parser (any field)
        raise UserError(f"{where}: malformed JSON (arrays or objects nested deeper than "
                        "Python's JSON parser allows); fix or remove the line") from None
    if not isinstance(obj, dict):
        raise UserError(f"{where}: a JSON object is expected, got {type(obj).__name__}")
    parts = []
    for key in keys:
        if key not in obj:
            raise UserError(f"{where}: no key {key!r} "
                            f"(keys: {', '.join(map(str, obj)) or 'none'}); "
                            "pass the right --json-keys")
        if not isinstance(obj[key], str):
            raise UserError(f"{where}: key {key!r} is {type(obj[key]).__name__}, not a string")
        parts.append(obj[key])
    text = "\n".join(parts)
    if not text.strip():
        return "empty or whitespace-only text", None
    return "ok", text
