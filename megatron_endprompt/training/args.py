"""``--endprompt-*`` flags (Megatron ``extra_args_provider``) and their start-up checks.

The PI factor ``s`` defaults to ``ceil(L / L0)``; ``L0`` (the model's original window)
defaults to ``--seq-length``, the usual case of training at the original window ``P = L0``.
At start-up every ``--data-path`` / ``--{train,valid,test}-data-path`` prefix with a sidecar is
checked against these flags, so a run never silently trains on a layout built for another
target length.
"""

from __future__ import annotations

import argparse
import math

from megatron_endprompt.errors import UserError


def add_endprompt_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register the EndPrompt flags with Megatron's parser."""
    g = parser.add_argument_group("EndPrompt")
    g.add_argument("--endprompt-target-length", type=int, default=None,
                   help="L: the context window being trained for (must match the sidecars)")
    g.add_argument("--endprompt-original-length", type=int, default=None,
                   help="L0: the model's original window (default: --seq-length)")
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
    return parser


def resolve_endprompt_args(args: argparse.Namespace) -> None:
    """Fill defaults (``s``) and validate; raises :class:`UserError` naming the flag."""
    L = args.endprompt_target_length
    if L is None:
        raise UserError("--endprompt-target-length L is required (the window to train for)")
    L0 = args.endprompt_original_length or args.seq_length
    if L <= args.seq_length:
        raise UserError(f"--endprompt-target-length {L} must exceed --seq-length "
                        f"{args.seq_length}")
    if L <= L0:
        raise UserError(f"--endprompt-target-length {L} must exceed the original window "
                        f"--endprompt-original-length {L0}")
    megatron_s = getattr(args, "rotary_seq_len_interpolation_factor", None)
    if args.endprompt_pi_factor is None:
        args.endprompt_pi_factor = float(megatron_s or math.ceil(L / L0))
    elif megatron_s is not None and float(megatron_s) != args.endprompt_pi_factor:
        raise UserError(
            f"--endprompt-pi-factor {args.endprompt_pi_factor:g} disagrees with "
            f"--rotary-seq-len-interpolation-factor {megatron_s}; both divide positions by s: "
            "set one of them")
    if not (math.isfinite(args.endprompt_pi_factor) and args.endprompt_pi_factor >= 1.0):
        raise UserError(f"--endprompt-pi-factor {args.endprompt_pi_factor} must be >= 1")
    args.endprompt_original_length = L0
    w = args.endprompt_terminal_loss_weight
    if w is not None and not (math.isfinite(w) and w > 0):
        raise UserError(f"--endprompt-terminal-loss-weight {w} must be finite and > 0")
    cw = args.endprompt_context_loss_weight
    if cw is not None and not (math.isfinite(cw) and cw >= 0):
        raise UserError(f"--endprompt-context-loss-weight {cw} must be finite and >= 0")
    if getattr(args, "position_embedding_type", "rope") != "rope":
        raise UserError("EndPrompt needs --position-embedding-type rope")


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
