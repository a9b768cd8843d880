"""The one checkpoint-directory resolver, used by training start-up and conversion (two had
drifted apart)."""

from __future__ import annotations

import os

import pytest

from megatron_endprompt.checkpoint_dir import TRACKER_FILE, resolve_checkpoint_dir
from megatron_endprompt.errors import UserError


def _save_dir(tmp_path, *iters, tracker=None, release=False):
    root = tmp_path / "save"
    root.mkdir()
    for n in iters:
        (root / f"iter_{n:07d}").mkdir()
    if release:
        (root / "release").mkdir()
    if tracker is not None:
        (root / TRACKER_FILE).write_text(f"{tracker}\n")
    return str(root)


def test_tracker_names_the_iteration_or_release(tmp_path):
    root = _save_dir(tmp_path, 3, 12, tracker=3, release=True)
    assert resolve_checkpoint_dir(root) == os.path.join(root, "iter_0000003")
    (tmp_path / "save" / TRACKER_FILE).write_text("release")
    assert resolve_checkpoint_dir(root) == os.path.join(root, "release")


def test_step_picks_its_directory(tmp_path):
    root = _save_dir(tmp_path, 3, 12, tracker=12)
    assert resolve_checkpoint_dir(root, step=3) == os.path.join(root, "iter_0000003")
    assert resolve_checkpoint_dir(root, step=4) is None


def test_without_tracker_training_loads_nothing_conversion_takes_the_newest(tmp_path):
    root = _save_dir(tmp_path, 3, 12)
    assert resolve_checkpoint_dir(root) is None  # Megatron's trainer would start from scratch
    assert resolve_checkpoint_dir(root, newest_without_tracker=True) == \
        os.path.join(root, "iter_0000012")


def test_a_checkpoint_directory_itself(tmp_path):
    ckpt = tmp_path / "iter_0000005"
    ckpt.mkdir()
    (ckpt / "metadata.json").write_text("{}")
    assert resolve_checkpoint_dir(str(ckpt)) == str(ckpt)
    assert resolve_checkpoint_dir(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("tag", ["abc", "7"])
def test_bad_tracker_is_one_line_naming_it(tmp_path, tag):
    root = _save_dir(tmp_path, 3, tracker=tag)
    with pytest.raises(UserError, match=TRACKER_FILE):
        resolve_checkpoint_dir(root)


def test_training_and_conversion_resolve_the_same_directory(tmp_path, monkeypatch):
    from argparse import Namespace

    from megatron_endprompt.conversion import megatron_ckpt
    from megatron_endprompt.training import args as targs

    root = _save_dir(tmp_path, 3, 12, tracker=3)
    (tmp_path / "save" / "iter_0000003" / "metadata.json").write_text("{}")
    (tmp_path / "save" / "iter_0000003" / ".metadata").write_bytes(b"")  # a finished save
    seen = []
    monkeypatch.setattr(targs, "check_checkpoint_complete", lambda p: seen.append(p) or
                        (_ for _ in ()).throw(UserError("stop")))
    with pytest.raises(UserError, match="stop"):
        targs.loaded_checkpoint_args(Namespace(load=root, ckpt_step=None,
                                               pretrained_checkpoint=None))
    from megatron.core import dist_checkpointing

    monkeypatch.setattr(dist_checkpointing, "check_is_distributed_checkpoint", lambda p: True)
    assert seen == [megatron_ckpt.find_checkpoint(root)] == [os.path.join(root, "iter_0000003")]
