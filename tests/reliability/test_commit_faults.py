"""A kill at every step of the commit leaves the old or the new dataset;
the prefix lock stops a second writer; stale temporaries of dead processes are removed.

The kill is real: a forked child runs the commit with ``MEGATRON_ENDPROMPT_FAULT_COMMIT_STEP=k``
and ``os._exit``-s right after step ``k`` (no ``finally``, no flush: what ``SIGKILL`` does);
then a reader (``inspect``'s path: :func:`ensure_committed` + sidecar check) must see the
complete old or the complete new dataset. One end-to-end run goes through the real CLI in a
subprocess to show the hook is the one preprocessing uses.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest

from megatron_endprompt.data.prepare.atomic_output import (
    COMMIT_STEPS,
    FAULT_ENV,
    PrefixWriter,
    ensure_committed,
    prefix_lock,
)
from megatron_endprompt.data.sidecar.sidecar import read_sidecar
from megatron_endprompt.errors import UserError

SUFFIXES = (".bin", ".idx", ".endprompt")


def _read(prefix):
    return {s: open(prefix + s, "rb").read() for s in SUFFIXES}


@pytest.fixture(scope="module")
def two_datasets(spm_args, spm_corpus, tmp_path_factory):
    """``old`` and ``new``: two different complete datasets (byte contents)."""
    from megatron_endprompt.cli import preprocess as preprocess_cli
    from megatron_endprompt.errors import run_cli

    root = tmp_path_factory.mktemp("two")
    old, new = str(root / "old"), str(root / "new")
    small = root / "small.jsonl"
    small.write_text("".join(open(spm_corpus.path).readlines()[:15]))
    assert run_cli(preprocess_cli.main, spm_args(old)) == 0
    assert run_cli(preprocess_cli.main, spm_args(new, inputs=[str(small)])) == 0
    return _read(old), _read(new)


def _killed_commit(prefix, new_bytes, step):
    """Fork; the child writes the new temporaries and commits with a kill after ``step``."""
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.environ[FAULT_ENV] = str(step)
            writer = PrefixWriter(prefix)
            for s, path in writer.tmp.items():
                with open(path, "wb") as f:
                    f.write(new_bytes[s])
            writer.commit()
            writer.close()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize("step", range(len(COMMIT_STEPS)))
def test_kill_at_every_commit_step_leaves_old_or_new(step, two_datasets, tmp_path):
    old, new = two_datasets
    prefix = str(tmp_path / "data")
    for s in SUFFIXES:
        with open(prefix + s, "wb") as f:
            f.write(old[s])
    code = _killed_commit(prefix, new, step)
    assert code == 137, f"the fault hook did not fire at step {step} ({COMMIT_STEPS[step]})"
    # a reader finishes an interrupted commit, then sees exactly one complete dataset
    ensure_committed(prefix)
    got = _read(prefix)
    assert got in (old, new), f"step {step} ({COMMIT_STEPS[step]}): a mixed dataset"
    assert got == (old if step < 2 else new)  # the journal rename is the commit point
    read_sidecar(prefix + ".endprompt", prefix=prefix)
    # the next writer cleans what the dead one left
    PrefixWriter(prefix).close()
    assert sorted(os.listdir(tmp_path)) == ["data" + s for s in sorted(SUFFIXES)]


@pytest.mark.process
def test_kill_inside_real_preprocessing_commit(spm_args, spm_corpus, two_datasets, tmp_path):
    """The CLI in a subprocess, killed right after the first rename of the commit."""
    old, new = two_datasets
    prefix = str(tmp_path / "data")
    for s in SUFFIXES:
        with open(prefix + s, "wb") as f:
            f.write(old[s])
    small = tmp_path / "small.jsonl"
    small.write_text("".join(open(spm_corpus.path).readlines()[:15]))
    env = {**os.environ, FAULT_ENV: "3"}
    proc = subprocess.run([sys.executable, "-m", "megatron_endprompt.cli.preprocess",
                           *spm_args(prefix, inputs=[str(small)])], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 137, proc.stderr[-2000:]
    assert os.path.exists(prefix + ".commit") and glob.glob(prefix + ".*.tmp-*")
    ensure_committed(prefix)
    assert _read(prefix) == new
    assert not glob.glob(str(tmp_path / "*.tmp-*")) and not os.path.exists(prefix + ".commit")


def test_second_writer_refused_while_first_holds_the_prefix(tmp_path):
    prefix = str(tmp_path / "data")
    first = PrefixWriter(prefix)
    try:
        with pytest.raises(UserError, match="another run .* is writing this prefix"):
            PrefixWriter(prefix)
    finally:
        first.close()
    PrefixWriter(prefix).close()  # released: the next run proceeds
    assert os.listdir(tmp_path) == []


def test_lock_is_exclusive_across_processes(tmp_path):
    prefix = str(tmp_path / "data")
    code = ("import sys; from megatron_endprompt.data.prepare.atomic_output import prefix_lock\n"
            "from megatron_endprompt.errors import UserError\n"
            "try:\n    with prefix_lock(sys.argv[1]): pass\n"
            "except UserError as e:\n    print(e); sys.exit(3)\n")
    with prefix_lock(prefix):
        proc = subprocess.run([sys.executable, "-c", code, prefix], capture_output=True,
                              text=True)
    assert proc.returncode == 3 and f"pid {os.getpid()}" in proc.stdout, proc.stderr
    proc = subprocess.run([sys.executable, "-c", code, prefix], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_stale_temporaries_of_dead_processes_removed_live_ones_kept(tmp_path):
    prefix = str(tmp_path / "data")
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for pid in (dead.pid, live.pid):
            for s in SUFFIXES:
                (tmp_path / f"data{s}.tmp-{pid}").write_bytes(b"x" * 100)
        PrefixWriter(prefix).close()
        left = sorted(os.listdir(tmp_path))
        assert left == sorted(f"data{s}.tmp-{live.pid}" for s in SUFFIXES)
    finally:
        live.kill()
        live.wait()


def test_stale_conversion_partials_removed(tmp_path):
    from megatron_endprompt.conversion.output import atomic_output_dir

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".out.partial-{dead.pid}-abcd"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"\0" * 1000)
    with atomic_output_dir(str(tmp_path / "out"), overwrite=False) as tmp:
        open(os.path.join(tmp, "config.json"), "w").write("{}")
    assert sorted(os.listdir(tmp_path)) == ["out"]
    shutil.rmtree(tmp_path / "out")
