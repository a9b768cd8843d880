"""``tools/build_endprompt_sidecar.py``: an EndPrompt sidecar for an existing ``.bin/.idx``.

The corpus is read, never rewritten; the sidecar goes beside it (``PREFIX.endprompt`` or
``PREFIX.NAME.endprompt`` with ``--name``), so one tokenized corpus serves many layouts.
"""

from __future__ import annotations

import argparse
import json
import sys

from megatron_endprompt.data.prefix_name import resolve_prefix
from megatron_endprompt.data.prompts import default_terminal_loss_weight
from megatron_endprompt.errors import UserError, run_cli
from megatron_endprompt.layout import PLACEMENTS, LayoutConfig


def add_layout_arguments(p: argparse.ArgumentParser) -> None:
    """The EndPrompt layout flags shared by preprocessing and sidecar building."""
    g = p.add_argument_group("EndPrompt layout")
    g.add_argument("--seq-length", type=int, required=True, help="P: physical sample length")
    g.add_argument("--target-length", type=int, required=True, help="L: target context window")
    g.add_argument("--terminal-length", type=int, default=None,
                   help="b: terminal tokens (continuation / document-tail)")
    g.add_argument("--placement", choices=PLACEMENTS, default="fixed",
                   help="fixed: terminal at L-b..L-1; random: start uniform in [a, L-b]")
    g.add_argument("--terminal-source", choices=("continuation", "document-tail", "prompt"),
                   default="continuation")
    g.add_argument("--terminal-prompts", default=None,
                   help="a built-in set, ep1 (default: EP1 alone, the paper's main result) or "
                        "ep1-3 (the EP1-EP3 mixture), or a file with one prompt per line")
    g.add_argument("--pose-chunks", type=int, default=1,
                   help="ET(PoSE): split the context into N>=2 pieces with random skips")
    g.add_argument("--terminal-loss-weight", type=float, default=None,
                   help="w > 0 (default: 0.1 for prompt terminals, a small w as the paper asks; "
                        "the paper gives no value; 1.0 for the other sources)")
    g.add_argument("--context-loss-weight", type=float, default=1.0,
                   help="1 keeps ordinary LM loss on the context; 0 trains terminals only")
    g.add_argument("--seed", type=int, default=1234)


def layout_from_args(args: argparse.Namespace) -> LayoutConfig:
    """``LayoutConfig`` of the shared flags (``ValueError`` on bad values)."""
    w = args.terminal_loss_weight
    if w is None:
        w = default_terminal_loss_weight(args.terminal_source)
    return LayoutConfig(seq_length=args.seq_length, target_length=args.target_length,
                        placement=args.placement, pose_chunks=args.pose_chunks,
                        terminal_loss_weight=w,
                        context_loss_weight=args.context_loss_weight)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="build_endprompt_sidecar.py",
        description="Write an EndPrompt sidecar for an existing Megatron .bin/.idx corpus "
                    "(the corpus is only read).",
    )
    p.add_argument("--data-prefix", required=True, help="PREFIX of PREFIX.bin / PREFIX.idx")
    p.add_argument("--name", default=None,
                   help="write PREFIX.NAME.endprompt (default PREFIX.endprompt)")
    p.add_argument("--tokenizer-type", default=None,
                   help="the corpus's tokenizer (needed by --terminal-source prompt); its "
                        "identity is recorded and checked at training (without it, training "
                        "warns that it cannot check the tokenizer)")
    p.add_argument("--tokenizer-model", default=None, help="tokenizer file or HF directory")
    p.add_argument("--vocab-size", type=int, default=None, help="NullTokenizer vocabulary size")
    add_layout_arguments(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--summary-json", action="store_true", help="print the summary as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from megatron_endprompt.compat import quiet_megatron_import_noise

    quiet_megatron_import_noise()
    from megatron_endprompt.data.build_sidecar import SidecarOptions, build_sidecar
    from megatron_endprompt.data.sidecar import sidecar_path
    from megatron_endprompt.data.tokenizer import TokenizerSpec

    args.data_prefix, note = resolve_prefix(args.data_prefix)
    if note:
        print(note, file=sys.stderr)
    spec = None
    if args.tokenizer_type:
        spec = TokenizerSpec(tokenizer_type=args.tokenizer_type,
                             tokenizer_model=args.tokenizer_model, vocab_size=args.vocab_size)
    try:
        opts = SidecarOptions(
            data_prefix=args.data_prefix, layout=layout_from_args(args),
            terminal_source=args.terminal_source, terminal_length=args.terminal_length,
            terminal_prompts=args.terminal_prompts, tokenizer=spec, seed=args.seed,
            name=args.name, progress=not args.no_progress)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    summary = build_sidecar(opts)
    if args.summary_json:
        print(json.dumps(summary, indent=2))
    else:
        from megatron_endprompt.data.coverage import coverage_line

        print(f"samples: {summary['samples_written']:,} from {summary['documents_used']:,} "
              f"documents ({summary['tokens_in']:,} tokens)")
        coverage = coverage_line(args.data_prefix, summary)
        if coverage:
            print(f"layout coverage: {coverage}")
        if spec is None:
            print("tokenizer: none recorded (give --tokenizer-type/--tokenizer-model to have "
                  "training check it)")
        print(f"wrote {sidecar_path(args.data_prefix, args.name)}")
    return 0


def cli() -> None:
    """Console-script entry point."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    cli()
