"""Files the launch script's start-up checks accept: a prefix whose ``.idx`` header names a
document count (all the checks read of it), its ``.bin`` and a sidecar whose header (written by
the library's own writer, no records) says the layout's ``P`` and ``L``, a base checkpoint
directory and a tokenizer directory, plus the environment that makes the script's checks use
this interpreter and this checkout."""

from __future__ import annotations

import os
import struct
import sys

import numpy as np

from megatron_endprompt.data.sidecar.sidecar import write_sidecar
from megatron_endprompt.data.sidecar.sidecar_format import SidecarHeader
from megatron_endprompt.layout import LayoutConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_prefix(path: str, docs: int, sidecar: str | None = "", *, seq_length: int = 8192,
                 target_length: int = 65536) -> str:
    """``path.{bin,idx}`` (header of a Megatron ``.idx`` saying ``docs`` documents) and, unless
    ``sidecar`` is None, ``path[.NAME].endprompt`` built for ``seq_length``/``target_length``
    (the launcher's defaults)."""
    with open(path + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + bytes([8])
                + struct.pack("<Q", docs) + struct.pack("<Q", docs + 1))
    open(path + ".bin", "wb").close()
    if sidecar is not None:
        layout = LayoutConfig(seq_length=seq_length, target_length=target_length)
        header = SidecarHeader(layout=layout.to_header(), terminal_source="continuation",
                               terminal_length=8, idx_bytes=os.path.getsize(path + ".idx"),
                               bin_bytes=0, idx_sha256="0" * 64)
        write_sidecar(path + (f".{sidecar}" if sidecar else "") + ".endprompt", header,
                      np.empty((0, layout.record_width), np.int32))
    return path


def launch_env(root) -> dict[str, str]:
    """``CHECKPOINT_IN``/``CHECKPOINT_OUT``/``TOKENIZER``/``DATA_PREFIX`` under ``root`` (real
    files), ``PYTHON`` and ``PYTHONPATH`` for the checks, and the test's own
    ``MEGATRON_ENDPROMPT_CACHE`` (never the user's cache)."""
    root = str(root)
    for d in ("in", "tok"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    cache = {k: os.environ[k] for k in ("MEGATRON_ENDPROMPT_CACHE",) if k in os.environ}
    return {"PATH": os.environ["PATH"], "PYTHON": sys.executable, **cache,
            "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "CHECKPOINT_IN": os.path.join(root, "in"), "CHECKPOINT_OUT": os.path.join(root, "out"),
            "TOKENIZER": os.path.join(root, "tok"),
            "DATA_PREFIX": write_prefix(os.path.join(root, "ep"), 5000)}
