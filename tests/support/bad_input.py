"""Shared helpers of the data bad-input tests (``tests/data/prepare/test_bad_input.py``,
``tests/data/sidecar/test_bad_sidecar.py``, ``tests/data/prepare/test_pose_placement.py``)."""

from __future__ import annotations

import glob
import json
import os
import shutil
from pathlib import Path

P, L, B = 64, 512, 8  # as in tests/conftest.py (spm_args)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUFFIXES = (".bin", ".idx", ".endprompt")
GOOD = json.dumps({"text": "The pass key of Alder is 12345. The river crosses the bridge."})


# -- helpers -------------------------------------------------------------------------------
def _jsonl(path: Path, lines: list) -> str:
    """Write raw lines (str or bytes) with newlines; returns the path."""
    with open(path, "wb") as f:
        for line in lines:
            f.write((line.encode("utf-8") if isinstance(line, str) else line) + b"\n")
    return str(path)


def _outputs(prefix) -> list[str]:
    """``PREFIX.*`` in the prefix's directory (temporaries ``PREFIX.bin.tmp-PID`` included)."""
    return sorted(glob.glob(glob.escape(str(prefix)) + ".*"))


def _snapshot(prefix) -> dict[str, bytes]:
    return {s: Path(str(prefix) + s).read_bytes() for s in SUFFIXES}


def _assert_one_error_line(rc, err, *needles, code=2):
    assert rc == code, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got {err!r}"
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert str(needle) in lines[0], (needle, lines[0])
    return lines[0]


def _drop_flag(argv: list[str], flag: str) -> list[str]:
    i = argv.index(flag)
    return argv[:i] + argv[i + 2:]


def _null_args(prefix, inputs, vocab=100):
    return ["--input", inputs, "--output-prefix", str(prefix), "--tokenizer-type",
            "NullTokenizer", "--vocab-size", str(vocab), "--seq-length", "4",
            "--target-length", "16", "--terminal-length", "1", "--no-progress"]


def _copy_good(good_output, directory: Path, name="data") -> str:
    directory.mkdir(parents=True, exist_ok=True)
    prefix = str(directory / name)
    for s in SUFFIXES:
        shutil.copyfile(good_output + s, prefix + s)
    return prefix
