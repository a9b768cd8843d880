"""``--endprompt-*`` flags (Megatron ``extra_args_provider``) and their start-up checks.

The window (``L``, ``L0``, ``s``, weight overrides) is resolved by
:class:`~megatron_endprompt.window.EndPromptWindow`: ``L0`` defaults to the model's original window
— the loaded checkpoint's ``max_position_embeddings`` when there is a checkpoint, else
``--max-position-embeddings`` — and ``s`` to ``ceil(L / L0)``. At start-up every ``--data-path`` / ``--{train,valid,test}-data-path`` prefix with a sidecar is
checked against these flags, so a run never silently trains on a layout built for another
target length.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from megatron_endprompt.window import EndPromptWindow
from megatron_endprompt.training.long_eval import add_long_eval_args


def add_endprompt_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register the EndPrompt flags with Megatron's parser."""
    g = parser.add_argument_group("EndPrompt")
    g.add_argument("--endprompt-target-length", type=int, default=None,
                   help="L: the context window being trained for (must match the sidecars)")
    g.add_argument("--endprompt-original-length", type=int, default=None,
                   help="L0: the model's original window (default: the loaded checkpoint's "
                   "max_position_embeddings, else --max-position-embeddings)")
    g.add_argument("--endprompt-pi-factor", type=float, default=None,
                   help="s: RoPE positions are divided by s (default: ceil(L / L0))")
    g.add_argument("--endprompt-terminal-loss-weight", type=float, default=None,
                   help="override the sidecars' terminal weight w (> 0)")
    g.add_argument("--endprompt-context-loss-weight", type=float, default=None,
                   help="override the sidecars' context weight (>= 0)")
    g.add_argument("--endprompt-require-sidecar", action="store_true",
                   help="refuse data prefixes without a sidecar (no plain replay data)")
    g.add_argument("--endprompt-loss-log", default=None, metavar="DIR",
                   help="write exact per-micro-batch loss terms to DIR/rank*.jsonl (debugging)")
    add_long_eval_args(parser)
    return parser


def resolve_endprompt_args(args: argparse.Namespace,
                           checkpoint_args: Any = None) -> EndPromptWindow:
    """Resolve the window (:meth:`EndPromptWindow.from_megatron_args`; raises
    :class:`~megatron_endprompt.errors.UserError` naming the flag) and write the resolved ``L0``
    and ``s`` back into ``args`` (Megatron saves them with every checkpoint)."""
    window = EndPromptWindow.from_megatron_args(args, checkpoint_args=checkpoint_args)
    args.endprompt_original_length = window.original_length
    args.endprompt_pi_factor = window.pi_factor
    return window


def _checkpoint_dir(root: str | None, step: int | None = None) -> str | None:
    """The ``iter_*``/``release`` directory Megatron would load from save directory ``root``."""
    if not root or not os.path.isdir(root):
        return None
    if step is not None:
        path = os.path.join(root, f"iter_{step:07d}")
        return path if os.path.isdir(path) else None
    tracker = os.path.join(root, "latest_checkpointed_iteration.txt")
    if not os.path.exists(tracker):
        return root if os.path.exists(os.path.join(root, "metadata.json")) else None
    with open(tracker) as f:
        tag = f.read().strip()
    name = "release" if tag == "release" else f"iter_{int(tag):07d}" if tag.isdigit() else None
    path = os.path.join(root, name) if name else None
    return path if path and os.path.isdir(path) else None


def loaded_checkpoint_args(args: argparse.Namespace) -> Any:
    """The saved Megatron args of the checkpoint this run will start from, or ``None``: ``--load``
    when it holds a checkpoint (at ``--ckpt-step`` if given), else ``--pretrained-checkpoint``.
    Only ``torch_dist`` checkpoints are read (their common state; no process group needed)."""
    candidates = [_checkpoint_dir(getattr(args, "load", None), getattr(args, "ckpt_step", None)),
                  _checkpoint_dir(getattr(args, "pretrained_checkpoint", None))]
    path = next((c for c in candidates if c is not None), None)
    if path is None or not os.path.exists(os.path.join(path, "metadata.json")):
        return None
    from megatron.core import dist_checkpointing
    from megatron.core.safe_globals import register_safe_globals

    register_safe_globals()
    try:
        return dist_checkpointing.load_common_state_dict(path).get("args")
    except Exception:  # noqa: BLE001 - unreadable common state: fall back to the flags
        return None


def data_prefixes(args: argparse.Namespace) -> list[str]:
    """Every data prefix named by the run's data flags (``--data-args-path`` and
    ``--per-split-data-args-path`` included)."""
    from megatron_endprompt.training.checks import blend_prefixes

    return blend_prefixes(args)


def check_sidecars(args: argparse.Namespace) -> dict[str, dict]:
    """Check every prefix's sidecar against the flags before training starts (the same check
    the dataset makes, :func:`~megatron_endprompt.data.dataset.find_sidecar`); returns
    ``{prefix: layout}`` for the EndPrompt prefixes (plain prefixes are replay data)."""
    from dataclasses import asdict

    from megatron_endprompt.data.dataset import find_sidecar

    found = {}
    for prefix in data_prefixes(args):
        sidecar = find_sidecar(
            prefix, seq_length=args.seq_length, target_length=args.endprompt_target_length,
            require=args.endprompt_require_sidecar,
            reset_positions=bool(args.reset_position_ids or args.reset_attention_mask))
        if sidecar is not None:
            found[prefix] = asdict(sidecar.layout)
    return found
