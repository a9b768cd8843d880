"""The test tiers (pytest.ini, tests/conftest.py): ``process`` and ``e2e`` tests are ``slow``
too, so ``-m "not slow"`` (``make check``) keeps only the fast tier whichever of the three
markers a test carries; a misspelt marker is an error (``--strict-markers``), not a test that
silently lands in the fast tier. Checked on a generated test file collected by a child pytest
with this repository's ``pytest.ini`` and ``tests/conftest.py`` (loaded as a plugin)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.process

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TIERED = '''
import pytest

def test_fast(): pass

@pytest.mark.process
def test_process(): pass

@pytest.mark.e2e
def test_e2e(): pass

@pytest.mark.slow
def test_slow(): pass
'''


def _collect(tmp_path, source: str, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "test_generated.py"
    path.write_text(source)
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-c", os.path.join(REPO, "pytest.ini"),
         "--rootdir", str(tmp_path), "-p", "tests.conftest", "--collect-only", "-q",
         *args, str(path)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def _ids(proc) -> set[str]:
    return {line.split("::")[1] for line in proc.stdout.splitlines() if "::" in line}


@pytest.mark.parametrize("expr, expected", [
    ("not slow", {"test_fast"}),  # make check
    ("slow", {"test_process", "test_e2e", "test_slow"}),
    ("process", {"test_process"}),
    ("e2e", {"test_e2e"}),
    ("not e2e", {"test_fast", "test_process", "test_slow"}),
])
def test_markers_select_their_tier(tmp_path, expr, expected):
    proc = _collect(tmp_path, TIERED, "-m", expr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _ids(proc) == expected


def test_a_misspelt_marker_is_an_error(tmp_path):
    proc = _collect(tmp_path, "import pytest\n\n@pytest.mark.proces\ndef test_x(): pass\n")
    assert proc.returncode != 0
    assert "'proces' not found in `markers` configuration option" in proc.stdout + proc.stderr


def test_collecting_tests_that_need_no_torch_imports_no_torch(tmp_path):
    """``tests/conftest.py`` imports torch only when a ``gpu`` test was collected (it paid
    ~30 s of torch import on every invocation before)."""
    path = tmp_path / "test_generated.py"
    path.write_text(TIERED)
    code = ("import sys, pytest\n"
            f"rc = pytest.main(['-c', {os.path.join(REPO, 'pytest.ini')!r}, '--rootdir', "
            f"{str(tmp_path)!r}, '-p', 'tests.conftest', '--collect-only', '-q', "
            f"{str(path)!r}])\n"
            "print('torch imported:', 'torch' in sys.modules)\n"
            "sys.exit(rc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": REPO}, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "torch imported: False" in proc.stdout, proc.stdout
