"""``tools/plan_endprompt_run.py``: memory, time and cost of EndPrompt at P vs full-length at L.

    tools/plan_endprompt_run.py --model llama3-8b --seq-length 8192 --target-length 65536 \\
        --gpus 32 --gpu h100-80gb --tokens 1e9 [--tp --pp --cp --micro-batch --recompute ...] \\
        [--json] [--plot plan.png]

Prints, for both methods, the cheapest TP/PP/CP layout that fits, the per-GPU memory
(weights, gradients, optimizer states, activations), step FLOPs, tokens/s and GPU-hours for the
budget at the stated MFU, and a sweep over target lengths (32K-128K); ``--plot`` draws memory
and GPU-hours against L. Formulas: see ``megatron_endprompt/planning``.
"""

from __future__ import annotations

import argparse
import json
import os

from megatron_endprompt.cli.kit import entry
from megatron_endprompt.disk import check_apart
from megatron_endprompt.errors import UserError, user_errors
from megatron_endprompt.planning import report
from megatron_endprompt.planning.eval_cost import RULER_TASKS, eval_cost
from megatron_endprompt.planning.launch_vars import (
    LAUNCH_SCRIPT,
    checkpoint_bytes,
    launch_line,
    model_note,
    script_defaults,
    wall_clock_hours,
)
from megatron_endprompt.planning.lora import lora_plan, lora_text
from megatron_endprompt.planning.plan import PlanSettings, plan_run, sweep
from megatron_endprompt.planning.presets import GPU_PRESETS, MODEL_PRESETS, model_from_hf_config
from megatron_endprompt.window import PLAN_FLAGS, EndPromptWindow

DEFAULT_SWEEP = "32768,49152,65536,98304,131072"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="plan_endprompt_run.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", choices=sorted(MODEL_PRESETS), help="model preset")
    src.add_argument("--hf-config", metavar="FILE", help="an HF config.json (or its directory)")
    p.add_argument("--launch-script", default=LAUNCH_SCRIPT, metavar="FILE",
                   help="the launch script whose VAR=${VAR:-default} lines give the defaults "
                        "below (default: examples/pretrain_llama3_endprompt.sh)")
    p.add_argument("--seq-length", type=int, default=None,
                   help="EndPrompt physical length P (default: the launch script's SEQ_LENGTH)")
    p.add_argument("--target-length", type=int, default=None,
                   help="target window L (default: the launch script's TARGET_LENGTH)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs in the cluster (default 8)")
    p.add_argument("--gpu", choices=sorted(GPU_PRESETS), default="h100-80gb")
    p.add_argument("--tokens", type=float, default=1e9, help="training tokens per method")
    p.add_argument("--tp", type=int, default=None, help="fix TP (default: searched)")
    p.add_argument("--pp", type=int, default=None, help="fix PP (default: searched)")
    p.add_argument("--cp", type=int, default=None, help="fix CP (default: searched)")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--global-batch-tokens", type=int, default=None,
                   help="tokens per optimizer step (default: the launch script's GLOBAL_BATCH x "
                        "SEQ_LENGTH)")
    p.add_argument("--recompute", choices=("none", "selective", "full"), default=None,
                   help="Megatron --recompute-granularity (full: uniform, 1 layer; default: the "
                        "launch script's)")
    p.add_argument("--eval-length", type=int, default=None, metavar="L",
                   help="length of the evaluation costed (default: --target-length)")
    p.add_argument("--eval-tasks", type=int, default=RULER_TASKS,
                   help=f"tasks of the evaluation suite (default {RULER_TASKS}: RULER)")
    p.add_argument("--eval-samples", type=int, default=100,
                   help="samples per task at the evaluation length (default 100)")
    p.add_argument("--mfu", type=float, default=0.40,
                   help="sustained fraction of bf16 peak on the executed FLOPs (default "
                        "0.40; = Megatron's MFU without recompute)")
    p.add_argument("--headroom", type=float, default=0.10,
                   help="fraction of GPU memory kept free (default 0.10)")
    p.add_argument("--no-distributed-optimizer", action="store_true",
                   help="replicate optimizer states on every DP rank")
    p.add_argument("--no-swiglu-fusion", action="store_true",
                   help="Megatron --no-bias-swiglu-fusion (keeps 5f instead of 3f per token)")
    p.add_argument("--sweep", default=DEFAULT_SWEEP, metavar="L1,L2,...",
                   help=f"target lengths of the sweep table and plot (default {DEFAULT_SWEEP})")
    p.add_argument("--lora-rank", type=int, default=None, metavar="R",
                   help="also plan EndPrompt with rank-R LoRA adapters on a frozen base "
                   "(the launcher's LORA_RANK)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--plot", metavar="FILE", help="write memory and GPU-hours vs L (png/pdf/svg)")
    return p


def _lengths(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise UserError(f"--sweep {text!r}: give comma-separated integers, e.g. "
                        f"{DEFAULT_SWEEP}") from None
    if not values or values[0] <= 0:
        raise UserError(f"--sweep {text!r}: give positive lengths, e.g. {DEFAULT_SWEEP}")
    return values


def _check_window(args: argparse.Namespace, model, lengths: list[int]) -> None:
    """L vs P vs L0 through the project's :class:`EndPromptWindow` (the rule training uses), for
    ``--target-length`` and every sweep length; the global batch must hold one sample."""

    sweep_flags = {**PLAN_FLAGS, "target_length": "--sweep"}
    for flag, L, flags in [("--target-length", args.target_length, PLAN_FLAGS)] + [
            ("--sweep", v, sweep_flags) for v in lengths]:
        with user_errors(f"{flag} {L}: "):
            EndPromptWindow(target_length=L, seq_length=args.seq_length,
                            original_length=model.original_window, flags=flags)
    if args.global_batch_tokens < args.seq_length:
        raise UserError(f"--global-batch-tokens {args.global_batch_tokens} is below one sample "
                        f"(--seq-length {args.seq_length}); give at least {args.seq_length}")


def _script_defaults(args: argparse.Namespace) -> int:
    """Fill unset flags from the launch script; returns its GPUS_PER_NODE."""
    d = script_defaults(args.launch_script)

    def number(var: str, flag: str | None) -> int:
        try:
            return int(d[var])
        except ValueError:
            instead = f" or pass {flag}" if flag else ""
            raise UserError(f"--launch-script {args.launch_script}: {var}'s default "
                            f"{d[var]!r} is not an integer; write {var}=${{{var}:-N}} with a "
                            f"whole number N{instead}") from None

    if args.seq_length is None:
        args.seq_length = number("SEQ_LENGTH", "--seq-length")
    if args.target_length is None:
        args.target_length = number("TARGET_LENGTH", "--target-length")
    if args.global_batch_tokens is None:
        args.global_batch_tokens = number("GLOBAL_BATCH", "--global-batch-tokens") * number(
            "SEQ_LENGTH", "--global-batch-tokens")
    gpus_per_node = number("GPUS_PER_NODE", None)
    if args.recompute is None:
        args.recompute = d["RECOMPUTE"]
    if args.eval_length is None:
        args.eval_length = args.target_length
    return gpus_per_node


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    gpus_per_node = _script_defaults(args)
    model = MODEL_PRESETS[args.model] if args.model else model_from_hf_config(args.hf_config)
    lengths = _lengths(args.sweep)
    if args.sweep == DEFAULT_SWEEP:  # the default grid keeps the lengths training accepts
        lengths = [v for v in lengths
                   if v > args.seq_length and v >= model.original_window] or [args.target_length]
    _check_window(args, model, lengths)
    if args.lora_rank is not None and args.lora_rank <= 0:
        raise UserError(f"--lora-rank {args.lora_rank} must be > 0")
    if args.plot:
        inputs = [("--hf-config", args.hf_config), ("--launch-script", args.launch_script)]
        check_apart(args.plot, [(f, p) for f, p in inputs if p], flag="--plot")
        if os.path.isdir(args.plot):
            raise UserError(f"--plot {args.plot} is a directory; give a file name in it, e.g. "
                            f"{os.path.join(args.plot, 'plan.png')}")
        out_dir = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(out_dir):
            raise UserError(f"--plot {args.plot}: directory {out_dir} does not exist")
        if os.path.splitext(args.plot)[1].lower() not in (".png", ".pdf", ".svg"):
            raise UserError(f"--plot {args.plot}: use a .png, .pdf or .svg file name")
    with user_errors():
        settings = PlanSettings(
            model=model, gpu=GPU_PRESETS[args.gpu], gpus=args.gpus, tokens=args.tokens,
            seq_length=args.seq_length, target_length=args.target_length,
            micro_batch=args.micro_batch, global_batch_tokens=args.global_batch_tokens,
            recompute=args.recompute, mfu=args.mfu, headroom=args.headroom,
            distributed_optimizer=not args.no_distributed_optimizer,
            swiglu_fusion=not args.no_swiglu_fusion, tp=args.tp, pp=args.pp, cp=args.cp)
        plans = plan_run(settings)
        rows = sweep(settings, lengths)
        evaluation = eval_cost(settings, length=args.eval_length, tasks=args.eval_tasks,
                               samples_per_task=args.eval_samples)
        lora = lora_plan(settings, args.lora_rank) if args.lora_rank else None
    if args.plot:
        report.write_plot(args.plot, settings, rows)
    if args.json:
        doc = report.plan_document(settings, plans, rows)
        print(json.dumps({**doc, "evaluation": evaluation.as_dict(),
                          "lora": lora.as_dict() if lora else None}, indent=1))
        return 0
    print(report.plan_table(settings, plans))

    ep = plans["endprompt"]
    print("\nlaunch (examples/pretrain_llama3_endprompt.sh variables, EndPrompt plan):")
    print(f"  {launch_line(settings, ep, gpus_per_node)}")
    if (note := model_note(settings)) is not None:
        print(f"  {note}")
    print(f"wall-clock: {wall_clock_hours(settings, ep):.2f} h for {settings.tokens:.3g} tokens "
          f"at {ep.tokens_per_second:,.0f} tokens/s (MFU {100 * settings.mfu:g}% of "
          f"{settings.gpu.peak_tflops:g} TFLOP/s bf16 peak on {settings.gpus} GPUs)")
    if lora is not None:
        print("\n" + lora_text(settings, args.lora_rank, lora,
                                launch_line(settings, lora, gpus_per_node)) + "\n")
    print(f"checkpoint: {checkpoint_bytes(settings) / 1e9:.0f} GB per save (parameters x 14 B: "
          "bf16 weights 2 + fp32 main weights 4 + Adam moments 8; the script keeps every save)")
    print("\n" + report.eval_text(settings, evaluation))
    print("\nsweep over the target length (EndPrompt stays at P):")
    print(report.sweep_table(rows))
    print("\nsources:")
    for key, text in report.SOURCES.items():
        print(f"  {key}: {text}")
    if args.plot:
        print(f"\nwrote {args.plot}")
    return 0


cli = entry(main)


if __name__ == "__main__":
    cli()
