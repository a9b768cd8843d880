"""The style the project keeps by a tool: ``ruff check`` with the repository's ``ruff.toml``
passes on the whole tree (ruff is pinned in requirements-dev.txt)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_passes_on_the_tree():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache",
                           "--output-format", "concise", "."], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert "No module named ruff" not in proc.stderr, \
        "ruff is not installed: pip install -r requirements-dev.txt"
    assert proc.returncode == 0, proc.stdout + proc.stderr
