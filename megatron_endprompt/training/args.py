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

from megatron_endprompt.checkpoint_dir import resolve_checkpoint_dir
from megatron_endprompt.data.tokenize.tokenizer_identity import TokenizerIdentity, tokenizer_identity
from megatron_endprompt.errors import UserError
from megatron_endprompt.model.yarn import ROPE_SCALINGS, YarnScaling, yarn_from_megatron_args
from megatron_endprompt.training.long_eval import add_long_eval_args
from megatron_endprompt.window import EndPromptWindow


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
    rope_scaling_from_args(args)  # YaRN's own checks, at start-up
    return window


def rope_scaling_from_args(args: argparse.Namespace) -> YarnScaling | None:
    """The run's YaRN / NTK-by-parts scaling (``None`` for linear PI), from the resolved window
    (factor ``s``, ``L0``). Raises :class:`UserError` naming the flag that conflicts."""
    kind = getattr(args, "endprompt_rope_scaling", None) or "linear"
    if kind == "linear":
        return None
    if getattr(args, "use_rope_scaling", False):
        raise UserError(f"--endprompt-rope-scaling {kind} replaces Llama-3.1 frequency scaling: "
                        "drop --use-rope-scaling")
    if getattr(args, "rotary_interleaved", False):
        raise UserError(f"--endprompt-rope-scaling {kind} needs rotate-half RoPE: drop "
                        "--rotary-interleaved")
    try:
        return yarn_from_megatron_args(args)
    except ValueError as exc:
        raise UserError(f"--endprompt-rope-scaling {kind}: {exc}") from None


def model_rope_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``EndPromptGPTModel``'s RoPE keywords: ``pi_factor = s`` for linear PI; for YaRN
    ``pi_factor = 1`` and ``yarn`` (whose factor is ``s``: positions are not divided)."""
    yarn = rope_scaling_from_args(args)
    if yarn is None:
        return {"pi_factor": args.endprompt_pi_factor}
    return {"pi_factor": 1.0, "yarn": yarn}


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


def check_sidecars(args: argparse.Namespace,
                   identity: TokenizerIdentity | None = None) -> dict[str, dict]:
    """Check every prefix's sidecar against the flags and the training tokenizer before
    training starts (the same check the dataset makes,
    :func:`~megatron_endprompt.data.dataset.find_sidecar`); returns ``{prefix: layout}`` for
    the EndPrompt prefixes (prefixes in ``--endprompt-replay-prefixes`` are replay data).

    Cheap on every rank (header checksum, sizes); global rank 0 also builds the training
    tokenizer to compare its identity, and runs the full verification once per file identity
    (:mod:`megatron_endprompt.data.sidecar.trust`), so a wrong tokenizer or a corrupt ``.idx`` is
    refused before Megatron starts and the other ranks find the verdict cached. ``identity``:
    the start-up :class:`TokenizerIdentity` (:func:`startup_tokenizer_identity`); without it,
    rank 0 computes it here."""
    import os
    from dataclasses import asdict

    from megatron_endprompt.data.dataset import find_sidecar
    from megatron_endprompt.data.sidecar.sidecar import check_sidecar_name
    from megatron_endprompt.data.split_counts import check_splits_nonempty
    from megatron_endprompt.data.sidecar.trust import cache_dir, ensure_verified
    from megatron_endprompt.training.checks import split_prefixes

    name = getattr(args, "endprompt_sidecar_name", None)
    check_sidecar_name(name)
    replay = getattr(args, "endprompt_replay_prefixes", None) or []
    prefixes = data_prefixes(args)
    split_by_flag = set(split_prefixes(args)) if isinstance(getattr(args, "split", None), str) \
        else set()
    matched = []
    for r in replay:  # as files: ``mg/small/`` or ``./mg/small`` name the prefix ``mg/small``
        same = [p for p in prefixes if os.path.abspath(r) == os.path.abspath(p)
                and not r.endswith(("/", ".bin", ".idx"))]
        if not same:
            hint = " (drop the trailing '/' or suffix)" if r.endswith(("/", ".bin", ".idx")) else ""
            raise UserError(f"--endprompt-replay-prefixes {r}: not one of the data prefixes "
                            f"(--data-path / --*-data-path){hint}; fix the path")
        matched.append(same[0])
    replay = args.endprompt_replay_prefixes = matched or replay
    # ``identity``: pretrain computes it once (startup_tokenizer_identity); else built here
    found = {}
    rank0 = _rank0()
    for prefix in prefixes:
        if identity is None and rank0 and getattr(args, "tokenizer_type", None):
            identity = training_tokenizer_identity(args)  # the datasets check it on every rank
        sidecar = find_sidecar(
            prefix, seq_length=args.seq_length, target_length=args.endprompt_target_length,
            name=name, replay_prefixes=replay, tokenizer_identity=identity,
            reset_positions=bool(args.reset_position_ids or args.reset_attention_mask))
        if prefix in split_by_flag:  # before anything is cached for the run
            check_splits_nonempty(prefix, sidecar, args.split)
        if sidecar is not None:
            ensure_verified(sidecar, prefix, cache_dir(prefix, getattr(args, "data_cache_path",
                                                                       None)), build=rank0)
            found[prefix] = asdict(sidecar.layout)
    return found


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
