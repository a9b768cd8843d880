"""``--endprompt-*`` flags (Megatron ``extra_args_provider``) and their start-up checks.

The window (``L``, ``L0``, ``s``, weight overrides) is resolved once, with the rest of the
run's settings, by :mod:`megatron_endprompt.training.run`: ``L0`` defaults to the model's original
window — the loaded checkpoint's ``max_position_embeddings`` when there is a checkpoint, else
``--max-position-embeddings`` — and ``s`` to ``ceil(L / L0)``. At start-up every ``--data-path`` /
``--{train,valid,test}-data-path`` prefix with a sidecar is checked against these flags, so a run
never silently trains on a layout built for another target length.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from megatron_endprompt.checkpoint_dir import resolve_checkpoint_dir
from megatron_endprompt.data.tokenize.tokenizer_identity import (TokenizerIdentity,
                                                                 tokenizer_identity)
from megatron_endprompt.errors import UserError
from megatron_endprompt.model.yarn import ROPE_SCALINGS
from megatron_endprompt.training.long_eval import add_long_eval_args

if TYPE_CHECKING:
    from megatron_endprompt.training.run import EndPromptRun


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
    g.add_argument("--endprompt-rope-scaling", choices=ROPE_SCALINGS, default="linear",
                   help="how RoPE reaches L: 'linear' divides positions by s (PI, default); "
                   "'yarn' uses YaRN frequencies with factor s over L0 and its attention factor "
                   "0.1 ln(s) + 1; 'ntk-by-parts' the same frequencies without it. Megatron's "
                   "--yarn-beta-fast/--yarn-beta-slow/--[no-]yarn-correction-range-round-to-int "
                   "set YaRN's ramp (defaults 32, 1, rounded)")
    g.add_argument("--endprompt-terminal-loss-weight", type=float, default=None,
                   help="override the sidecars' terminal weight w (> 0)")
    g.add_argument("--endprompt-context-loss-weight", type=float, default=None,
                   help="override the sidecars' context weight (>= 0)")
    g.add_argument("--endprompt-require-sidecar", nargs=0, action=_RetiredFlag,
                   default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    g.add_argument("--endprompt-sidecar-name", default=None, metavar="NAME",
                   help="read PREFIX.NAME.endprompt (a named layout) instead of PREFIX.endprompt")
    g.add_argument("--endprompt-replay-prefixes", nargs="+", default=None, metavar="PREFIX",
                   help="data prefixes trained as plain replay data (GPTDataset packing, "
                        "contiguous positions); any other prefix needs a sidecar")
    g.add_argument("--endprompt-loss-log", default=None, metavar="DIR",
                   help="write exact per-micro-batch loss terms to DIR/rank*.jsonl (debugging)")
    g.add_argument("--endprompt-lora-rank", type=int, default=None, metavar="R",
                   help="train LoRA adapters of rank R on the --endprompt-lora-targets linears; "
                   "the base model is frozen (default: off, full fine-tuning)")
    g.add_argument("--endprompt-lora-alpha", type=float, default=None,
                   help="LoRA alpha: the adapters add (alpha / R) B A x (default: R)")
    g.add_argument("--endprompt-lora-dropout", type=float, default=None,
                   help="dropout on the adapters' input (default 0)")
    g.add_argument("--endprompt-lora-targets", nargs="+", default=None, metavar="LINEAR",
                   help="linears with adapters, of linear_qkv linear_proj linear_fc1 linear_fc2 "
                   "(default: all four)")
    g.add_argument("--endprompt-lora-adapters-only", action="store_true",
                   help="checkpoints hold the adapters and their optimizer state only; a resume "
                   "reads the frozen base from --pretrained-checkpoint")
    add_long_eval_args(parser)
    return parser


def loaded_checkpoint_args(args: argparse.Namespace) -> Any:
    """The saved Megatron args of the checkpoint this run will start from, or ``None``: ``--load``
    when it holds a checkpoint (at ``--ckpt-step`` if given), else ``--pretrained-checkpoint``.
    Only ``torch_dist`` checkpoints are read (their common state; no process group needed)."""
    candidates = [resolve_checkpoint_dir(getattr(args, "load", None),
                                         step=getattr(args, "ckpt_step", None)),
                  resolve_checkpoint_dir(getattr(args, "pretrained_checkpoint", None))]
    path = next((c for c in candidates if c is not None), None)
    if path is None or not os.path.exists(os.path.join(path, "metadata.json")):
        return None
    check_checkpoint_complete(path)
    from megatron.core import dist_checkpointing
    from megatron.core.safe_globals import register_safe_globals

    register_safe_globals()
    try:
        return dist_checkpointing.load_common_state_dict(path).get("args")
    except Exception:  # noqa: BLE001 - unreadable common state: fall back to the flags
        return None


def check_checkpoint_complete(path: str) -> None:
    """Refuse a ``torch_dist`` checkpoint whose ``.metadata`` names a shard file that is not
    there (a copy or a save cut short): Megatron would fail in its load with a traceback after
    initialising every rank. Reads the metadata only (no tensor data)."""
    meta = os.path.join(path, ".metadata")
    if not os.path.exists(meta):
        return
    from torch.distributed.checkpoint import FileSystemReader

    try:
        storage = FileSystemReader(path).read_metadata().storage_data or {}
    except Exception as exc:  # noqa: BLE001 - a torn or foreign metadata file
        raise UserError(f"{meta}: unreadable checkpoint metadata ({str(exc)[:100]}); the "
                        "checkpoint is incomplete: copy it again or load an earlier one") \
            from None
    files = sorted({getattr(v, "relative_path", None) for v in storage.values()} - {None})
    missing = [f for f in files if not os.path.exists(os.path.join(path, f))]
    if missing:
        raise UserError(f"{path}: the checkpoint is incomplete: {missing[0]} is missing "
                        f"({len(missing)} of {len(files)} shard files); copy it again or load "
                        "an earlier checkpoint (--ckpt-step)")


def data_prefixes(args: argparse.Namespace) -> list[str]:
    """Every data prefix named by the run's data flags (``--data-args-path`` and
    ``--per-split-data-args-path`` included)."""
    from megatron_endprompt.training.checks import blend_prefixes

    return blend_prefixes(args)


def check_sidecars(args: argparse.Namespace, run: EndPromptRun) -> dict[str, dict]:
    """Check every prefix's sidecar against the run and the training tokenizer before
    training starts (the same check the dataset makes,
    :func:`~megatron_endprompt.data.dataset.find_sidecar`); returns ``{prefix: layout}`` for
    the EndPrompt prefixes (the run's replay prefixes are replay data).

    Cheap on every rank (header checksum, sizes); global rank 0 also builds the training
    tokenizer to compare its identity, and runs the full verification once per file identity
    (:mod:`megatron_endprompt.data.sidecar.trust`), so a wrong tokenizer or a corrupt ``.idx`` is
    refused before Megatron starts and the other ranks find the verdict cached. The identity is
    the run's (:func:`startup_tokenizer_identity`); without one, rank 0 computes it here."""
    from megatron_endprompt.data.dataset import find_sidecar
    from megatron_endprompt.data.split_counts import check_splits_nonempty
    from megatron_endprompt.data.sidecar.trust import cache_dir, ensure_verified
    from megatron_endprompt.training.checks import split_prefixes

    prefixes = data_prefixes(args)
    split_by_flag = set(split_prefixes(args)) if isinstance(getattr(args, "split", None), str) \
        else set()
    identity = run.tokenizer_identity
    found = {}
    rank0 = _rank0()
    for prefix in prefixes:
        if identity is None and rank0 and getattr(args, "tokenizer_type", None):
            identity = training_tokenizer_identity(args)  # the datasets check it on every rank
        sidecar = find_sidecar(
            prefix, seq_length=args.seq_length, target_length=run.window.target_length,
            name=run.sidecar_name, replay_prefixes=list(run.replay_prefixes),
            tokenizer_identity=identity,
            reset_positions=bool(args.reset_position_ids or args.reset_attention_mask))
        if prefix in split_by_flag:  # before anything is cached for the run
            check_splits_nonempty(prefix, sidecar, args.split)
        if sidecar is not None:
            ensure_verified(sidecar, prefix, cache_dir(prefix, getattr(args, "data_cache_path",
                                                                       None)), build=rank0)
            found[prefix] = sidecar.layout.to_header()
    return found


class _RetiredFlag(argparse.Action):
    """A flag that no longer does anything: accepted (an old launch line asked for what now
    always happens) with one ``warning:`` line on rank 0, and not stored, so neither ``args``
    nor a checkpoint carries it."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if _rank0():
            print(f"warning: {option_string} is no longer needed (every data prefix needs a "
                  "sidecar unless listed in --endprompt-replay-prefixes); drop it from the "
                  "launch line", file=sys.stderr)


def _rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def startup_tokenizer_identity(args: argparse.Namespace) -> TokenizerIdentity | None:
    """The training tokenizer's identity, computed once at start-up on global rank 0 when the
    run names data prefixes and a tokenizer (``None`` elsewhere): ``pretrain`` hands it to
    :func:`check_sidecars` and to the datasets, which then do not fingerprint again."""
    if _rank0() and getattr(args, "tokenizer_type", None) and data_prefixes(args):
        return training_tokenizer_identity(args)
    return None


def training_tokenizer_identity(args: argparse.Namespace) -> TokenizerIdentity:
    """Identity of the tokenizer Megatron will build from ``args`` (same builder)."""
    import copy

    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer

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
