"""Where the benchmarks write by default: ``benchmarks/out/`` (git-ignored), whichever study."""

from __future__ import annotations

import os

#: ``benchmarks/``
BENCH = os.path.dirname(os.path.abspath(__file__))
#: The repository root (the checkout whose ``megatron_endprompt`` and ``tools/`` are measured).
REPO = os.path.dirname(BENCH)
#: ``benchmarks/out/``: every study's default output folder.
OUT = os.path.join(BENCH, "out")
