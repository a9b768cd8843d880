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
                   help="(default now; kept for compatibility) refuse data prefixes without a "
                        "sidecar unless listed in --endprompt-replay-prefixes")
    g.add_argument("--endprompt-sidecar-name", default=None, metavar="NAME",
                   help="read PREFIX.NAME.endprompt (a named layout) instead of PREFIX.endprompt")
    g.add_argument("--endprompt-replay-prefixes", nargs="+", default=None, metavar="PREFIX",
                   help="data prefixes trained as plain replay data (GPTDataset packing, "
                        "contiguous positions); any other prefix needs a sidecar")
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
    if not args.endprompt_pi_factor >= 1.0:
        raise UserError(f"--endprompt-pi-factor {args.endprompt_pi_factor} must be >= 1")
    args.endprompt_original_length = L0
    w = args.endprompt_terminal_loss_weight
    if w is not None and not w > 0:
        raise UserError(f"--endprompt-terminal-loss-weight {w} must be > 0")
    cw = args.endprompt_context_loss_weight
    if cw is not None and cw < 0:
        raise UserError(f"--endprompt-context-loss-weight {cw} must be >= 0")
    if getattr(args, "position_embedding_type", "rope") != "rope":
        raise UserError("EndPrompt needs --position-embedding-type rope")


def data_prefixes(args: argparse.Namespace) -> list[str]:
    """Every data prefix named by the run's data flags."""
    from megatron.core.datasets.utils import get_blend_from_list

    prefixes: list[str] = []
    for flag in ("data_path", "train_data_path", "valid_data_path", "test_data_path"):
        values = getattr(args, flag, None)
        if values:
            blend = get_blend_from_list(values)
            if blend is not None:
                prefixes.extend(blend[0])
    return list(dict.fromkeys(prefixes))


def check_sidecars(args: argparse.Namespace) -> dict[str, dict]:
    """Check every prefix's sidecar against the flags and the training tokenizer before
    training starts (the same check the dataset makes,
    :func:`~megatron_endprompt.data.dataset.find_sidecar`); returns ``{prefix: layout}`` for
    the EndPrompt prefixes (prefixes in ``--endprompt-replay-prefixes`` are replay data).

    Cheap on every rank (header checksum, sizes); global rank 0 also builds the training
    tokenizer to compare its identity, and runs the full verification once per file identity
    (:mod:`megatron_endprompt.data.trust`), so a wrong tokenizer or a corrupt ``.idx`` is
    refused before Megatron starts and the other ranks find the verdict cached."""
    import os
    from dataclasses import asdict

    from megatron_endprompt.data.dataset import find_sidecar
    from megatron_endprompt.data.sidecar import check_sidecar_name
    from megatron_endprompt.data.trust import cache_dir, ensure_verified

    name = getattr(args, "endprompt_sidecar_name", None)
    check_sidecar_name(name)
    replay = getattr(args, "endprompt_replay_prefixes", None) or []
    prefixes = data_prefixes(args)
    for r in replay:
        if not any(os.path.abspath(r) == os.path.abspath(p) for p in prefixes):
            raise UserError(f"--endprompt-replay-prefixes {r}: not one of the data prefixes "
                            "(--data-path / --*-data-path); fix the path")
    identity = None
    found = {}
    rank0 = os.environ.get("RANK", "0") == "0"
    for prefix in prefixes:
        if identity is None and rank0 and getattr(args, "tokenizer_type", None):
            identity = training_tokenizer_identity(args)  # the datasets check it on every rank
        sidecar = find_sidecar(
            prefix, seq_length=args.seq_length, target_length=args.endprompt_target_length,
            name=name, replay_prefixes=replay, tokenizer_identity=identity,
            reset_positions=bool(args.reset_position_ids or args.reset_attention_mask))
        if sidecar is not None:
            ensure_verified(sidecar, prefix, cache_dir(prefix, getattr(args, "data_cache_path",
                                                                       None)), build=rank0)
            found[prefix] = asdict(sidecar.layout)
    return found


def training_tokenizer_identity(args: argparse.Namespace) -> dict:
    """Identity of the tokenizer Megatron will build from ``args`` (same builder)."""
    import copy

    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer

    from megatron_endprompt.data.tokenizer_identity import tokenizer_identity

    probe = copy.copy(args)
    probe.rank = 1  # no "> building tokenizer" banner from this probe
    probe.pad_vocab_size = False  # Megatron pads (and checks its flags) itself later
    try:
        tokenizer = build_tokenizer(probe)
    except Exception as exc:  # the libraries raise anything from OSError to RuntimeError
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"--tokenizer-model {args.tokenizer_model}: cannot load a "
                        f"{args.tokenizer_type} ({first[:200]}); check the path and "
                        "--tokenizer-type") from None
    return tokenizer_identity(tokenizer, tokenizer_type=args.tokenizer_type,
                              tokenizer_model=args.tokenizer_model)
