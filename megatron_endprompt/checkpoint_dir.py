"""Which directory of a Megatron save directory holds the checkpoint to read: the
one resolver for training start-up (``--load``/``--pretrained-checkpoint``, ``--ckpt-step``)
and conversion (``convert_checkpoint.py --checkpoint``). A base module (like ``errors``), so
both ``training`` and ``conversion`` import it without an upward arrow.

Megatron's rules: a save directory holds ``latest_checkpointed_iteration.txt`` naming
``release`` or an iteration ``N`` (directory ``iter_{N:07d}``); ``--ckpt-step N`` picks
``iter_{N:07d}`` directly. A directory holding ``metadata.json`` is a checkpoint itself.
Without a tracker Megatron's trainer loads nothing; conversion may then take the newest
``iter_*`` (or ``release``): ``newest_without_tracker``.
"""

from __future__ import annotations

import os

from megatron_endprompt.errors import UserError

__all__ = ["TRACKER_FILE", "resolve_checkpoint_dir"]

TRACKER_FILE = "latest_checkpointed_iteration.txt"


def _from_tracker(root: str) -> str:
    tracker = os.path.join(root, TRACKER_FILE)
    with open(tracker) as f:
        tag = f.read().strip()
    name = "release" if tag == "release" else f"iter_{int(tag):07d}" if tag.isdigit() else None
    if name is None:
        raise UserError(f"{tracker}: cannot parse {tag!r} (an iteration number or 'release'); "
                        "fix the file or point at an iter_* directory")
    path = os.path.join(root, name)
    if not os.path.isdir(path):
        raise UserError(f"{tracker} points to {path}, which does not exist; fix the file or "
                        "point at an existing iter_* directory")
    return path


def _newest(root: str) -> str | None:
    iters = sorted(d for d in os.listdir(root)
                   if d.startswith("iter_") and d[5:].isdigit()
                   and os.path.isdir(os.path.join(root, d)))
    if iters:
        return os.path.join(root, iters[-1])
    release = os.path.join(root, "release")
    return release if os.path.isdir(release) else None


def resolve_checkpoint_dir(root: str | None, *, step: int | None = None,
                           newest_without_tracker: bool = False) -> str | None:
    """The checkpoint directory to read under ``root``, or ``None`` when ``root`` is not a
    directory or holds no checkpoint (the caller decides whether that is an error). Raises
    :class:`UserError` for a tracker that cannot be parsed or names a missing directory."""
    if not root or not os.path.isdir(root):
        return None
    if step is not None:
        path = os.path.join(root, f"iter_{step:07d}")
        return path if os.path.isdir(path) else None
    if os.path.exists(os.path.join(root, TRACKER_FILE)):
        return _from_tracker(root)
    if os.path.exists(os.path.join(root, "metadata.json")):
        return root
    return _newest(root) if newest_without_tracker else None
