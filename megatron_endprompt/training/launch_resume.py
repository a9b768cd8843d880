"""The launch script's resume check, run before ``torchrun`` (and by ``--dry-run``): a
``CHECKPOINT_OUT`` that already holds a checkpoint is resumed by the launch (``--load``), and
Megatron refuses to resume it under another learning-rate schedule (most often a larger
``TRAIN_ITERS`` after the run finished) with an assertion after every rank has started and
loaded the model. The pretrain entry refuses it in one line before Megatron starts
(:func:`~megatron_endprompt.training.schedule_check.check_schedule_continues`); the same check
runs here on the script's schedule flags (``SCHEDULE_FLAGS``, the flags the script passes) with
the extra flags last, so a dry run that passes does not stop there. So is the warm-up against
the run's length (:func:`check_warmup`: a short trial ``TRAIN_ITERS`` under the default
``WARMUP_ITERS``), which Megatron asserts after the model build.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from megatron_endprompt.checkpoint_dir import resolve_checkpoint_dir
from megatron_endprompt.errors import UserError
from megatron_endprompt.training.schedule_check import check_schedule_continues, check_warmup_fits

__all__ = ["check_resume_schedule", "check_warmup", "schedule_args"]


def _parser() -> argparse.ArgumentParser:
    """The flags the scheduler is built from, with Megatron's defaults and types."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    p.add_argument("--train-iters", type=int)
    p.add_argument("--global-batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--min-lr", type=float, default=0.0)
    p.add_argument("--lr-decay-style", default="linear")
    p.add_argument("--lr-decay-iters", type=int)
    p.add_argument("--lr-warmup-iters", type=int, default=0)
    p.add_argument("--lr-warmup-fraction", type=float)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--start-weight-decay", type=float)
    p.add_argument("--end-weight-decay", type=float)
    p.add_argument("--weight-decay-incr-style", default="constant")
    p.add_argument("--ckpt-step", type=int)
    for switch in ("--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler",
                   "--finetune", "--no-load-optim"):
        p.add_argument(switch, action="store_true")
    return p


def schedule_args(schedule_flags: list[str], extra: list[str], load: str) -> argparse.Namespace:
    """The launch's schedule as Megatron will parse it: the script's ``schedule_flags``, then
    the ``extra`` flags (the last value of a flag wins, as in Megatron's parser); other flags
    are ignored. A value argparse cannot read is left to the extra-flag check."""
    try:
        args, _ = _parser().parse_known_args([*schedule_flags, *extra])
    except argparse.ArgumentError:  # a malformed extra value: Megatron's parser reports it
        args, _ = _parser().parse_known_args(schedule_flags)
    args.load = load
    return args


def check_warmup(env: Mapping[str, str], extra: list[str]) -> None:
    """The launch's warm-up against its length (:func:`check_warmup_fits`, which every rank
    runs after start-up): a ``WARMUP_ITERS`` not below ``TRAIN_ITERS`` is one line naming
    both variables; when the extra flags set the warm-up or the decay, the line names flags."""
    args = schedule_args(env.get("SCHEDULE_FLAGS", "").split(), extra,
                         env.get("CHECKPOINT_OUT", ""))
    try:
        check_warmup_fits(args)
    except UserError:
        given = {f.partition("=")[0] for f in extra}
        if given & {"--lr-warmup-iters", "--lr-warmup-fraction", "--lr-decay-iters",
                    "--train-iters"}:
            raise
        raise UserError(f"WARMUP_ITERS={args.lr_warmup_iters} is not below TRAIN_ITERS="
                        f"{args.train_iters}: Megatron's learning-rate scheduler needs the "
                        "warm-up shorter than the run (it asserts so after building the model); "
                        "set WARMUP_ITERS below TRAIN_ITERS (e.g. WARMUP_ITERS=0 for a short "
                        "trial run)") from None


def check_resume_schedule(env: Mapping[str, str], extra: list[str]) -> None:
    """Refuse a launch whose ``CHECKPOINT_OUT`` holds a checkpoint saved under another
    schedule, unless a scheduler flag is among ``extra``; one :class:`UserError` naming the
    variable, the checkpoint and the flag that continues the run. Reads the checkpoint's
    common state only (no tensor data), and only when there is a checkpoint."""
    out = env.get("CHECKPOINT_OUT", "")
    args = schedule_args(env.get("SCHEDULE_FLAGS", "").split(), extra, out)
    path = resolve_checkpoint_dir(out, step=args.ckpt_step)
    if path is None:
        return
    # lazy: spares torch (Megatron's checkpoint reader), imported only for a resume
    from megatron_endprompt.training.args import loaded_checkpoint_args

    saved = loaded_checkpoint_args(argparse.Namespace(load=out, ckpt_step=args.ckpt_step,
                                                      pretrained_checkpoint=None))
    try:
        check_schedule_continues(args, saved)
    except UserError as exc:
        if saved is not None and getattr(saved, "train_iters", None) != args.train_iters:
            raise UserError(f"TRAIN_ITERS={args.train_iters}: CHECKPOINT_OUT={out} holds a run "
                            f"saved with --train-iters {saved.train_iters} ({path}); "
                            f"{_FIX}") from None
        raise UserError(f"CHECKPOINT_OUT={out}: {exc}") from None


_FIX = ("Megatron refuses to resume it under another learning-rate schedule; to continue it "
        "append --override-opt_param-scheduler (this launch's schedule, counting on from the "
        "saved step) or --use-checkpoint-opt_param-scheduler (the saved schedule)")
