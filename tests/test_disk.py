"""``megatron_endprompt.disk``: the one atomic write and the one writability rule."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from megatron_endprompt import disk
from megatron_endprompt.data.prepare.atomic_output import prefix_lock
from megatron_endprompt.errors import UserError, io_error_line


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path):
    path = str(tmp_path / "r.json")
    disk.write_text(path, "old\n")
    disk.write_text(path, "new\n")
    assert open(path).read() == "new\n" and os.listdir(tmp_path) == ["r.json"]


def test_a_failed_write_keeps_the_old_content(tmp_path):
    path = str(tmp_path / "r.json")
    disk.write_text(path, "old\n")
    with pytest.raises(RuntimeError, match="disk full"):
        with disk.atomic_path(path) as tmp:
            with open(tmp, "w") as f:
                f.write("half")
            raise RuntimeError("disk full")
    assert open(path).read() == "old\n" and os.listdir(tmp_path) == ["r.json"]


def test_stale_temporaries_of_dead_processes_are_removed(tmp_path):
    path = str(tmp_path / "x.endprompt")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for pid in (dead, str(os.getpid())):
        open(f"{path}.tmp-{pid}", "w").close()
    assert disk.remove_stale_temporaries(path) == [f"{path}.tmp-{dead}"]
    assert os.listdir(tmp_path) == [f"x.endprompt.tmp-{os.getpid()}"]


def test_check_writable_probes_the_nearest_existing_ancestor(tmp_path):
    disk.check_writable(str(tmp_path / "a" / "b" / "out.json"), flag="--output")
    assert os.listdir(tmp_path) == []  # nothing left behind
    disk.check_writable(str(tmp_path / "a" / "out.json"), flag="--output", create=True)
    assert os.listdir(tmp_path) == ["a"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match=r"^--output .*file/out\.json: cannot write in "):
        disk.check_writable(str(tmp_path / "file" / "out.json"), flag="--output")
    with pytest.raises(UserError, match="cannot write in /proc"):
        disk.check_writable(f"/proc/endprompt-{os.getpid()}/out", flag="--output-prefix")


def test_check_apart_compares_files_not_strings(tmp_path):
    """is / contains / lies inside, through a symlink and ``..``; a sibling passes."""
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    (tmp_path / "alias").symlink_to(tmp_path / "models")
    inputs = [("--hf-dir", str(model))]
    for out, relation in ((tmp_path / "alias" / "m", " is "),
                          (tmp_path / "alias", " contains "),
                          (tmp_path / "models" / "x" / ".." / "m" / "sub", " lies inside ")):
        with pytest.raises(UserError, match=relation):
            disk.check_apart(str(out), inputs)
    disk.check_apart(str(tmp_path / "models" / "other"), inputs)
    disk.check_apart(str(tmp_path / "new"), [("--hf-dir", str(tmp_path / "missing"))])


def test_exclusive_refuses_a_second_holder_and_cleans_up(tmp_path):
    lock = tmp_path / "a" / "b" / ".out.lock"
    with disk.exclusive(str(lock), busy="busy by {pid}"):
        assert lock.read_text().strip() == str(os.getpid())
        with pytest.raises(UserError, match=f"busy by {os.getpid()}"):
            with disk.exclusive(str(lock), busy="busy by {pid}"):
                pass
    assert not (tmp_path / "a").exists()  # the lock and the directories made for it are gone


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_exclusive_lock_never_opens_through_a_link(tmp_path, link):
    model = tmp_path / "model.safetensors"
    model.write_bytes(b"weights" * 100)
    lock = tmp_path / ".out.lock"
    (os.symlink if link == "symlink" else os.link)(model, lock)
    with pytest.raises(UserError, match="lock file"):
        with disk.exclusive(str(lock), busy="busy {pid}"):
            pass
    assert model.read_bytes() == b"weights" * 100


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def guarded_output(path, **kw):
    from megatron_endprompt.conversion.output import guarded_output  # its package loads torch

    return guarded_output(path, **kw)


#: The package's two lock users: a dataset prefix (preprocess, sidecar build, merge) and a
#: conversion's output directory. Each opens the lock beside what it writes.
LOCK_USERS = {
    "prefix": (lambda root: prefix_lock(os.path.join(root, "data", "ep")),
               lambda root: os.path.join(root, "data", "ep.lock")),
    "conversion output": (lambda root: guarded_output(os.path.join(root, "data", "hf"), inputs=[],
                                                      overwrite=False),
                          lambda root: os.path.join(root, "data", ".hf.lock")),
}


@pytest.mark.parametrize("user", sorted(LOCK_USERS))
def test_both_lock_users_behave_the_same_on_a_full_disk(tmp_path, monkeypatch, user):
    """Recording the holder's pid is the lock's only write: on a full disk both users raise
    the same ``OSError`` naming the lock file (the tools print it as one ``error:`` line), and
    leave no lock file and no open descriptor behind (the lock is free for the next run)."""
    lock, path = LOCK_USERS[user]
    (tmp_path / "data").mkdir()

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    before = _open_fds()
    with pytest.raises(OSError) as err:
        with lock(str(tmp_path)):
            pass
    assert (err.value.errno, err.value.filename) == (errno.ENOSPC, path(str(tmp_path)))
    assert "No space left" in io_error_line(err.value)
    assert not os.path.lexists(path(str(tmp_path)))
    assert _open_fds() == before
    monkeypatch.undo()
    with lock(str(tmp_path)):  # the next run takes it
        assert open(path(str(tmp_path))).read().strip() == str(os.getpid())
