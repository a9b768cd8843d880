"""Continuing a run with another schedule (most often a larger ``--train-iters`` after the run
finished): one line at start-up naming the flag that continues it.

On a resume Megatron's ``OptimizerParamScheduler.load_state_dict`` asserts that the saved
learning-rate and weight-decay schedule equals the one the flags build, unless
``--override-opt_param-scheduler`` (take this command's schedule; the step count continues from
the checkpoint) or ``--use-checkpoint-opt_param-scheduler`` (keep the saved one) is given. The
schedule is in samples: decay over ``(--lr-decay-iters or --train-iters) x global batch``,
weight-decay increments over ``--train-iters x global batch``, so a larger ``--train-iters``
alone changes it, and the assertion fires after every rank has built the model and loaded the
checkpoint (~2 minutes on CPU for a 135M model). Here the saved ``args`` are compared before
Megatron starts.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from megatron_endprompt.checkpoint_dir import resolve_checkpoint_dir
from megatron_endprompt.errors import UserError

__all__ = ["check_schedule_continues", "check_warmup_fits", "schedule_of"]


def schedule_of(args: Any) -> dict[str, Any] | None:
    """The scheduler values Megatron checks on a resume, as ``get_optimizer_param_scheduler``
    computes them from ``args`` for iteration-based training (``None``: sample-based)."""
    train_iters = getattr(args, "train_iters", None)
    gbs = getattr(args, "global_batch_size", None)
    if not train_iters or not gbs:
        return None
    decay_iters = getattr(args, "lr_decay_iters", None) or train_iters
    fraction = getattr(args, "lr_warmup_fraction", None)
    warmup = fraction * decay_iters * gbs if fraction is not None else \
        getattr(args, "lr_warmup_iters", 0) * gbs
    wd = getattr(args, "weight_decay", None)
    start_wd = getattr(args, "start_weight_decay", None)
    end_wd = getattr(args, "end_weight_decay", None)
    return {
        "--train-iters": train_iters,
        "--lr-decay-iters": decay_iters,
        "--global-batch-size": gbs,
        "--lr": getattr(args, "lr", None),
        "--min-lr": getattr(args, "min_lr", None),
        "--lr-decay-style": getattr(args, "lr_decay_style", None),
        "warm-up samples": warmup,
        "--start-weight-decay": wd if start_wd is None else start_wd,
        "--end-weight-decay": wd if end_wd is None else end_wd,
        "--weight-decay-incr-style": getattr(args, "weight_decay_incr_style", None),
    }


def check_schedule_continues(args: argparse.Namespace, saved: Any) -> None:
    """Refuse a resume from ``--load`` whose saved schedule (``saved``: the checkpoint's args)
    differs from this run's without either scheduler flag; one :class:`UserError` naming the
    first difference and both flags."""
    if saved is None or getattr(args, "finetune", False) or getattr(args, "no_load_optim", False):
        return
    if getattr(args, "override_opt_param_scheduler", False) or \
            getattr(args, "use_checkpoint_opt_param_scheduler", False):
        return
    load = getattr(args, "load", None)
    path = resolve_checkpoint_dir(load, step=getattr(args, "ckpt_step", None)) if load else None
    if path is None or os.path.basename(os.path.normpath(path)) == "release":
        return  # from --pretrained-checkpoint, or a release: Megatron loads no schedule
    now, then = schedule_of(args), schedule_of(saved)
    if now is None or then is None:
        return
    for key, value in now.items():
        if then[key] != value:
            raise UserError(
                f"{key} {value}: the checkpoint {path} (--load {load}) "
                f"was saved with {key} {then[key]}, and Megatron refuses to resume another "
                "learning-rate schedule (an OptimizerParamScheduler assertion after loading); to "
                "continue the run add --override-opt_param-scheduler (this command's schedule, "
                "counting on from the checkpoint's step) or --use-checkpoint-opt_param-scheduler "
                "(the saved schedule)")


def check_warmup_fits(args: Any) -> None:
    """Refuse a warm-up as long as the decay (``--lr-warmup-iters`` >= ``--train-iters``, e.g.
    the launcher's 20 warm-up iterations in a 4-iteration trial run): Megatron's
    ``OptimizerParamScheduler`` asserts ``warm-up steps < decay steps`` only after every rank
    has built the model, a bare ``AssertionError`` under a torchrun traceback. One
    :class:`UserError` naming the flags; sample-based runs are left to Megatron."""
    schedule = schedule_of(args)
    if schedule is None:
        return
    decay_iters = schedule["--lr-decay-iters"]
    if schedule["warm-up samples"] < decay_iters * schedule["--global-batch-size"]:
        return
    fraction = getattr(args, "lr_warmup_fraction", None)
    warmup = (f"--lr-warmup-fraction {fraction}" if fraction is not None
              else f"--lr-warmup-iters {getattr(args, 'lr_warmup_iters', 0)}")
    decay = ("--lr-decay-iters" if getattr(args, "lr_decay_iters", None) else "--train-iters")
    raise UserError(f"{warmup} leaves no iteration after the warm-up ({decay} {decay_iters}): "
                    "Megatron's learning-rate scheduler needs the warm-up shorter than the decay "
                    f"(it asserts so after building the model); lower the warm-up below {decay} "
                    "(e.g. --lr-warmup-iters 0 for a short trial run)")
