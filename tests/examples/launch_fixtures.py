"""Files the launch script's start-up checks accept: a prefix whose ``.idx`` header names a
document count (all the checks read of it), its ``.bin`` and a sidecar file, a base checkpoint
directory and a tokenizer directory, plus the environment that makes the script's checks use
this interpreter and this checkout."""

from __future__ import annotations

import os
import struct
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_prefix(path: str, docs: int, sidecar: str | None = "") -> str:
    """``path.{bin,idx}`` (header of a Megatron ``.idx`` saying ``docs`` documents) and, unless
    ``sidecar`` is None, ``path[.NAME].endprompt``."""
    with open(path + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + bytes([8])
                + struct.pack("<Q", docs) + struct.pack("<Q", docs + 1))
    open(path + ".bin", "wb").close()
    if sidecar is not None:
        open(path + (f".{sidecar}" if sidecar else "") + ".endprompt", "wb").close()
    return path


def launch_env(root) -> dict[str, str]:
    """``CHECKPOINT_IN``/``CHECKPOINT_OUT``/``TOKENIZER``/``DATA_PREFIX`` under ``root`` (real
    files), ``PYTHON`` and ``PYTHONPATH`` for the checks."""
    root = str(root)
    for d in ("in", "tok"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    return {"PATH": os.environ["PATH"], "PYTHON": sys.executable,
            "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "CHECKPOINT_IN": os.path.join(root, "in"), "CHECKPOINT_OUT": os.path.join(root, "out"),
            "TOKENIZER": os.path.join(root, "tok"),
            "DATA_PREFIX": write_prefix(os.path.join(root, "ep"), 5000)}
