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


def test_no_project_issue_numbers_in_the_package():
    """Code says why, not which ticket asked: a docstring's "(issue 15)" means nothing to a
    reader without the tracker. (Tests may still name the defect they guard.)"""
    import re

    pattern = re.compile(r"\bissues? #?\d+|\(issue\b", re.IGNORECASE)
    found = []
    for top in ("megatron_endprompt", "tools"):
        for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
            for name in names:
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    with open(path, encoding="utf-8") as f:
                        found += [f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()}"
                                  for i, line in enumerate(f, 1) if pattern.search(line)]
    assert not found, "\n".join(found)
