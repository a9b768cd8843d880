"""What ``--dry-run`` of examples/pretrain_llama3_endprompt.sh checks that the launch would
otherwise refuse only after every rank has started: the transformer implementation the machine
can run (chosen, said in one note line), the sidecar's ``P``/``L`` against ``SEQ_LENGTH``/
``TARGET_LENGTH`` (naming the variable), a placeholder ``CHECKPOINT_IN`` (the planner's paste
line), and extra flags checked without importing Megatron once the option list is cached."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess

import pytest
from launch_fixtures import REPO, launch_env, write_prefix

from megatron_endprompt.training import launch_check

pytestmark = pytest.mark.process  # the script and its checker as subprocesses

SCRIPT = os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")


def _dry(env, *args):
    return subprocess.run(["bash", SCRIPT, "--dry-run", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def _impl(proc) -> str:
    words = shlex.split(proc.stdout)
    return words[len(words) - 1 - words[::-1].index("--transformer-impl") + 1]


@pytest.mark.parametrize("te, cuda, want", [(False, False, "local"), (True, False, "local"),
                                            (False, True, "local"),
                                            (True, True, "transformer_engine")])
def test_transformer_impl_is_the_machines(monkeypatch, te, cuda, want):
    """Transformer Engine only where it is installed and a CUDA GPU is visible."""
    monkeypatch.setattr(launch_check, "_te_installed", lambda: te)
    monkeypatch.setattr(launch_check, "_cuda_available", lambda: cuda)
    impl, why = launch_check.transformer_impl([])
    assert impl == want and why
    # the user's flag is kept; transformer_engine without what it needs is one line now
    assert launch_check.transformer_impl(["--transformer-impl", "local"])[0] == "local"
    if want == "local":
        with pytest.raises(launch_check.UserError, match="transformer_engine"):
            launch_check.transformer_impl(["--transformer-impl=transformer_engine"])
    else:
        assert launch_check.transformer_impl(["--transformer-impl", "transformer_engine"])[0] \
            == "transformer_engine"


def test_a_cpu_launch_line_is_local_with_one_note(tmp_path):
    """On this CPU machine (with or without Transformer Engine importable) the command says
    ``--transformer-impl local`` and one note line says why; the launch then runs as
    written (before: transformer_engine, and every rank refused it after start-up)."""
    env = launch_env(tmp_path)
    proc = _dry(env)
    assert proc.returncode == 0, proc.stderr
    assert _impl(proc) == "local"
    notes = [n for n in proc.stderr.splitlines() if "--transformer-impl" in n]
    assert len(notes) == 1 and notes[0].startswith("note: --transformer-impl local (")
    fake = tmp_path / "fake_te" / "transformer_engine"  # importable, but no GPU here
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    te_env = {**env, "PYTHONPATH": f"{fake.parent}{os.pathsep}{env['PYTHONPATH']}"}
    proc = _dry(te_env)
    assert proc.returncode == 0, proc.stderr
    assert _impl(proc) == "local"
    assert "note: --transformer-impl local (no CUDA GPU visible)" in proc.stderr.splitlines()


def _refused(env, *args) -> str:
    proc = _dry(env, *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [n for n in proc.stderr.strip().splitlines()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@pytest.mark.parametrize("over, says", [
    ({"SEQ_LENGTH": "4096"}, "SEQ_LENGTH=4096, but"),
    ({"TARGET_LENGTH": "131072", "PI_FACTOR": "16"}, "TARGET_LENGTH=131072, but"),
])
def test_sidecar_layout_against_the_variables(tmp_path, over, says):
    """The sidecar (built for P = 8192, L = 65536) against SEQ_LENGTH / TARGET_LENGTH: one line
    naming the variable and the value to set; before, the dry run passed and every rank refused
    it minutes later naming the Megatron flag."""
    env = launch_env(tmp_path)
    line = _refused({**env, **over})
    assert says in line and "ep.endprompt was built for" in line
    assert ("SEQ_LENGTH=8192" if "SEQ_LENGTH" in over else "TARGET_LENGTH=65536") in line


def test_named_sidecar_layout_is_checked_too(tmp_path):
    env = launch_env(tmp_path)
    prefix = write_prefix(str(tmp_path / "named"), 5000, sidecar="L32K", target_length=32768)
    line = _refused({**env, "DATA_PREFIX": prefix, "SIDECAR_NAME": "L32K"})
    assert "TARGET_LENGTH=65536, but" in line and "named.L32K.endprompt" in line
    assert "--name L32K" in line


def test_placeholder_checkpoint_in_is_named(tmp_path):
    """The planner's paste line starts with ``CHECKPOINT_IN='<...>'``: a dry run says it is not
    set and that the model shown is the script's default; a real launch refuses it."""
    env = {**launch_env(tmp_path), "CHECKPOINT_IN": "<SmolLM2-135M converted by hf-to-megatron>"}
    proc = _dry(env)
    assert proc.returncode == 0, proc.stderr
    note = [n for n in proc.stderr.splitlines() if n.startswith("note: not set:")]
    assert len(note) == 1, proc.stderr
    assert "CHECKPOINT_IN (a placeholder: <SmolLM2-135M converted by hf-to-megatron>)" in note[0]
    assert "Llama-3 8B" in note[0]
    real = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert real.returncode == 2
    assert real.stderr.startswith("error: set CHECKPOINT_IN (a placeholder"), real.stderr


def _importtime_python(tmp_path) -> str:
    """An interpreter for the checks that reports every import on stderr."""
    import sys

    wrapper = tmp_path / "python_importtime"
    wrapper.write_text(f"#!/usr/bin/env bash\nexec {sys.executable} -X importtime \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return str(wrapper)


def test_extra_flags_import_megatron_once(tmp_path):
    """Extra flags are checked against the pretrain entry's parser; its option list is built
    (Megatron imported) once per installation and read from the cache after: a dry run with
    flags stays a one-second command instead of a Megatron import each time."""
    env = {**launch_env(tmp_path), "PYTHON": _importtime_python(tmp_path),
           "MEGATRON_ENDPROMPT_CACHE": str(tmp_path / "cache")}
    flags = ["--seed", "3", "--log-interval", "5"]
    first = _dry(env, *flags)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "megatron.training.arguments" in first.stderr
    second = _dry(env, *flags, "--eval-iters", "2")
    assert second.returncode == 0, second.stderr[-2000:]
    assert "megatron.training" not in second.stderr  # the cached list: no Megatron import
    assert shlex.split(second.stdout)[-2:] == ["--eval-iters", "2"]
    typo = _dry(env, "--dryrun")  # still refused from the cached list
    assert typo.returncode == 2 and "did you mean --dry-run?" in typo.stderr
