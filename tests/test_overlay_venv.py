"""``tools/overlay_venv.sh``, which CI uses to run the 0.18.2 subset: the overlay's one package
shadows the base venv's copy (modules and metadata), everything else comes from the base, and
bad arguments are one ``error:`` line. The replacement is a wheel written here (no index), of a
package the test venv really holds (``tqdm``), so shadowing is tested against a real install."""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
import zipfile

import pytest

pytestmark = pytest.mark.process  # pip and a child interpreter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tools", "overlay_venv.sh")
BASE = sys.prefix   # the venv running the suite (.venv)


def _wheel(directory, name: str, version: str) -> None:
    """A minimal pure-Python wheel ``name-version`` whose module records its version."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f'__version__ = "{version}-overlay"\n',
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(directory / f"{name}-{version}-py3-none-any.whl", "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)


def _run(*args, env=None):
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env)


def test_the_overlay_package_shadows_the_base_and_the_rest_comes_from_it(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "tqdm", "0.0.1")
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    new = tmp_path / "overlay"
    proc = _run(BASE, str(new), "tqdm==0.0.1", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "overlay: tqdm 0.0.1" in proc.stdout
    probe = ("import importlib.metadata as md, numpy, tqdm, megatron_endprompt; print("
             "tqdm.__version__, md.version('tqdm'), numpy.__file__, md.version('numpy'))")
    env_clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(new / "bin" / "python"), "-c", probe], capture_output=True,
                         text=True, timeout=300, env=env_clean, check=True).stdout.split()
    assert out[:2] == ["0.0.1-overlay", "0.0.1"]
    assert out[2].startswith(BASE) and out[3] == md.version("numpy"), out   # the rest: the base's
    # Run again over the existing overlay (CI's venv may persist): same result.
    assert _run(BASE, str(new), "tqdm==0.0.1", env=env).returncode == 0


def test_bad_arguments_are_one_error_line(tmp_path):
    cases = [
        ((BASE, str(tmp_path / "n"), "megatron-core"), "must pin one version"),
        ((str(tmp_path / "missing"), str(tmp_path / "n"), "a==1"), "make venv"),
        ((BASE, str(tmp_path / "n")), "usage"),
    ]
    for args, words in cases:
        proc = _run(*args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith("error:") and words in lines[0], lines
        assert not (tmp_path / "n").exists()
