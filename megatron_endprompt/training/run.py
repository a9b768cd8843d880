"""One training run's EndPrompt settings, read from Megatron's parsed flags once, here.

``pretrain.main`` builds an :class:`EndPromptRun` at start-up and hands it to the model and
datasets providers, the forward step and the long-eval hook as closures. Nothing that runs
during training reads ``endprompt_*`` back from Megatron's ``get_args()``: a value read twice
from a mutable namespace can drift from the value that was checked (a lint test holds every
other module to that). ``args`` keeps the resolved ``L0`` and ``s`` because Megatron saves
``args`` with every checkpoint and the export and a resumed run read them from there.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

from megatron_endprompt.data.tokenize.tokenizer_identity import TokenizerIdentity
from megatron_endprompt.errors import UserError, user_errors
from megatron_endprompt.loss_weights import LossWeights
from megatron_endprompt.model.lora_settings import LoraSettings, lora_settings
from megatron_endprompt.model.yarn import YarnScaling, yarn_scaling
from megatron_endprompt.training.checks import blend_prefixes, check_target_length
from megatron_endprompt.training.lora_model import check_lora_checkpoints
from megatron_endprompt.window import TRAINING_FLAGS, EndPromptWindow, explicit_pi_factor

__all__ = ["EndPromptRun", "LongEvalSettings", "build_run", "long_eval_settings",
           "resolve_endprompt_args"]


@dataclass(frozen=True, kw_only=True)
class LongEvalSettings:
    """The ``--endprompt-long-eval-*`` flags as read once at start-up (:func:`long_eval_settings`);
    checked by :class:`~megatron_endprompt.training.long_eval.LongEvaluator`."""

    interval: int
    """Evaluate every ``interval`` iterations (a multiple of ``--eval-interval``)."""

    lengths: str | None = None
    """Comma list of lengths as given; ``None``: the target length."""

    tasks: str = "ppl,passkey"
    """Comma list of ``ppl``, ``passkey`` as given."""

    data: str | None = None
    """Held-out long documents for ``ppl`` (``.jsonl``, ``.txt`` or a ``.bin/.idx`` prefix)."""

    samples: int = 4
    """Documents (``ppl``) and prompts (``passkey``) per length."""

    target_length: int | None = None
    """``L`` (``--endprompt-target-length``): the longest length allowed and the default one."""


@dataclass(frozen=True, kw_only=True)
class EndPromptRun:
    """What the providers, the forward step and the long-eval hook need of the EndPrompt flags,
    typed and checked once."""

    window: EndPromptWindow
    """``L``, ``L0``, ``s`` and the loss-weight overrides, resolved (checkpoint included)."""

    rope_scaling: str = "linear"
    """``--endprompt-rope-scaling``: ``linear`` (PI), ``yarn`` or ``ntk-by-parts``."""

    yarn: YarnScaling | None = None
    """YaRN's scaling for ``yarn``/``ntk-by-parts`` (factor ``s`` over ``L0``); ``None`` for PI."""

    tokenizer_identity: TokenizerIdentity | None = None
    """The start-up tokenizer identity (global rank 0); ``None``: each dataset computes it."""

    sidecar_name: str | None = None
    """``--endprompt-sidecar-name``: read ``PREFIX.NAME.endprompt`` instead of
    ``PREFIX.endprompt``."""

    replay_prefixes: tuple[str, ...] = ()
    """``--endprompt-replay-prefixes``, each matched to the data prefix it names (Megatron's
    other spelling, ``PREFIX`` for ``PREFIX_text_document`` or the reverse, resolved first)."""

    notes: tuple[str, ...] = ()
    """One-line notes for rank 0 to print at start-up: a replay prefix given in Megatron's
    other spelling, with the name used."""

    loss_log: str | None = None
    """``--endprompt-loss-log``: the directory of exact per-micro-batch loss terms, or ``None``."""

    long_eval: LongEvalSettings | None = None
    """The long-context validation settings; ``None`` when it is off."""

    lora: LoraSettings | None = None
    """The ``--endprompt-lora-*`` adapters; ``None``: full fine-tuning."""

    def model_rope_kwargs(self) -> dict[str, Any]:
        """``EndPromptGPTModel``'s RoPE keywords: ``pi_factor = s`` for linear PI; for YaRN
        ``pi_factor = 1`` and ``yarn`` (whose factor is ``s``: positions are not divided)."""
        if self.yarn is None:
            return {"pi_factor": self.window.pi_factor}
        return {"pi_factor": 1.0, "yarn": self.yarn}


def long_eval_settings(args: argparse.Namespace) -> LongEvalSettings | None:
    """The ``--endprompt-long-eval-*`` flags (``None`` when the interval is 0: off). The first
    read of ``L`` at start-up (``pretrain.main``, right after the start-up checks): its bound is
    checked here, before the long-eval data and the checkpoint are read."""
    check_target_length(getattr(args, "endprompt_target_length", None))
    if not getattr(args, "endprompt_long_eval_interval", 0):
        return None
    return LongEvalSettings(interval=int(args.endprompt_long_eval_interval),
                            lengths=args.endprompt_long_eval_lengths,
                            tasks=args.endprompt_long_eval_tasks,
                            data=args.endprompt_long_eval_data,
                            samples=int(args.endprompt_long_eval_samples),
                            target_length=args.endprompt_target_length)


def _window(args: argparse.Namespace, checkpoint_args: Any = None) -> EndPromptWindow:
    """The training window from Megatron's parsed flags plus ours.

    ``L0``: ``--endprompt-original-length``; else the L0 the loaded checkpoint's run recorded
    (a resumed EndPrompt run); else the checkpoint's ``max_position_embeddings``; else
    ``--max-position-embeddings``. ``s``: ``--endprompt-pi-factor`` or Megatron's
    ``--rotary-seq-len-interpolation-factor`` (equal if both), else ``ceil(L / L0)``.
    Raises :class:`UserError` naming the flag.
    """
    f = TRAINING_FLAGS
    L = getattr(args, "endprompt_target_length", None)
    if L is None:
        raise UserError(f"{f['target_length']} L is required (the window to train for)")
    if getattr(args, "position_embedding_type", "rope") != "rope":
        raise UserError("EndPrompt needs --position-embedding-type rope")
    L0, source = getattr(args, "endprompt_original_length", None), f["original_length"]
    if L0 is None and checkpoint_args is not None:
        if getattr(checkpoint_args, "endprompt_original_length", None):
            L0 = checkpoint_args.endprompt_original_length
            source = "the loaded checkpoint's recorded L0"
        elif getattr(checkpoint_args, "max_position_embeddings", None):
            L0 = checkpoint_args.max_position_embeddings
            source = "the loaded checkpoint's max_position_embeddings"
    if L0 is None:
        L0, source = getattr(args, "max_position_embeddings", None), "--max-position-embeddings"
    if L0 is None:
        raise UserError(f"the model's original window is unknown: pass "
                        f"{f['original_length']} L0 or --max-position-embeddings")
    with user_errors():
        s = explicit_pi_factor(getattr(args, "endprompt_pi_factor", None),
                               getattr(args, "rotary_seq_len_interpolation_factor", None), f)
        return EndPromptWindow(
            target_length=int(L), seq_length=args.seq_length, original_length=int(L0),
            original_length_from=source, pi_factor=s,
            loss_weights=LossWeights(terminal=getattr(args, "endprompt_terminal_loss_weight", None),
                                     context=getattr(args, "endprompt_context_loss_weight", None)))


def _yarn(args: argparse.Namespace, window: EndPromptWindow) -> YarnScaling | None:
    """The run's YaRN / NTK-by-parts scaling (``None`` for linear PI) from the resolved window
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
        return yarn_scaling(kind, factor=window.pi_factor,
                            original_length=window.original_length, megatron_args=args)
    except ValueError as exc:
        raise UserError(f"--endprompt-rope-scaling {kind}: {exc}") from None


def resolve_endprompt_args(args: argparse.Namespace,
                           checkpoint_args: Any = None) -> EndPromptWindow:
    """Resolve the window (raises :class:`UserError` naming the flag), check the RoPE scaling
    flags against it, and write the resolved ``L0`` and ``s`` back into ``args``: Megatron saves
    them with every checkpoint, where the export and a resumed run find them."""
    window = _window(args, checkpoint_args)
    args.endprompt_original_length = window.original_length
    args.endprompt_pi_factor = window.pi_factor
    _yarn(args, window)  # YaRN's own checks, at start-up
    return window


def _matched_replay(args: argparse.Namespace,
                    replay: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(prefixes, notes)``: each ``--endprompt-replay-prefixes`` entry, in Megatron's other
    spelling when only that one exists (:func:`resolve_prefix`, as the start-up checks do for
    ``--data-path``), as the data prefix it names, compared as files (``mg/small/`` or
    ``./mg/small`` name the prefix ``mg/small``); with the notes of the names resolved."""
    if not replay:
        return (), ()
    from megatron_endprompt.data.prepare.prefix_name import resolve_prefix

    prefixes = blend_prefixes(args)
    matched, notes = [], []
    for given in replay:
        r, note = resolve_prefix(given)
        if note:
            notes.append(note)
        same = [p for p in prefixes if os.path.abspath(r) == os.path.abspath(p)
                and not r.endswith(("/", ".bin", ".idx"))]
        if not same:
            hint = " (drop the trailing '/' or suffix)" if r.endswith(("/", ".bin", ".idx")) else ""
            raise UserError(f"--endprompt-replay-prefixes {given}: not one of the data prefixes "
                            f"(--data-path / --*-data-path){hint}; fix the path")
        matched.append(same[0])
    return tuple(matched), tuple(notes)


def build_run(args: argparse.Namespace, *, window: EndPromptWindow,
              tokenizer_identity: TokenizerIdentity | None = None,
              long_eval: LongEvalSettings | None = None) -> EndPromptRun:
    """The run's :class:`EndPromptRun` from the parsed flags and the resolved ``window``
    (:func:`resolve_endprompt_args`). Raises :class:`UserError` naming the flag."""
    from megatron_endprompt.data.sidecar.sidecar import check_sidecar_name

    name = getattr(args, "endprompt_sidecar_name", None)
    check_sidecar_name(name)
    replay, notes = _matched_replay(args, getattr(args, "endprompt_replay_prefixes", None) or [])
    lora = lora_settings(rank=getattr(args, "endprompt_lora_rank", None),
                         alpha=getattr(args, "endprompt_lora_alpha", None),
                         dropout=getattr(args, "endprompt_lora_dropout", None),
                         targets=getattr(args, "endprompt_lora_targets", None),
                         adapters_only=bool(getattr(args, "endprompt_lora_adapters_only", False)),
                         seed=getattr(args, "seed", 1234))
    check_lora_checkpoints(args, lora)  # an adapter-only resume names its base
    return EndPromptRun(
        window=window,
        rope_scaling=getattr(args, "endprompt_rope_scaling", None) or "linear",
        yarn=_yarn(args, window),
        tokenizer_identity=tokenizer_identity,
        sidecar_name=name,
        replay_prefixes=replay,
        notes=notes,
        loss_log=getattr(args, "endprompt_loss_log", None),
        long_eval=long_eval,
        lora=lora)
