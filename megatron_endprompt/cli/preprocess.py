"""``tools/preprocess_endprompt.py``: JSONL -> ``PREFIX.bin/.idx`` + ``PREFIX.endprompt``.

Flag names follow Megatron-LM's ``tools/preprocess_data.py`` where they exist.
"""

from __future__ import annotations

import argparse
import json
import sys

from megatron_endprompt.errors import UserError, run_cli
from megatron_endprompt.layout import PLACEMENTS, LayoutConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="preprocess_endprompt.py",
        description="Tokenize JSONL into Megatron .bin/.idx plus an EndPrompt position sidecar.",
    )
    g = p.add_argument_group("input / output (Megatron names)")
    g.add_argument("--input", nargs="+", required=True, help="JSONL file(s); globs allowed")
    g.add_argument("--json-keys", nargs="+", default=["text"],
                   help="text keys; several are joined with a newline (default: text)")
    g.add_argument("--output-prefix", required=True,
                   help="writes PREFIX.bin, PREFIX.idx and PREFIX.endprompt")
    g.add_argument("--tokenizer-type", required=True,
                   help="Megatron tokenizer type, e.g. HuggingFaceTokenizer, "
                        "GPTSentencePieceTokenizer, TikTokenizer, NullTokenizer")
    g.add_argument("--tokenizer-model", default=None, help="tokenizer file or HF directory")
    g.add_argument("--vocab-size", type=int, default=None, help="NullTokenizer vocabulary size")
    g.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    g.add_argument("--append-eod", action="store_true", help="append EOD to every document")
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
                   help="file with one prompt per line (default: built-in set)")
    g.add_argument("--pose-chunks", type=int, default=1,
                   help="ET(PoSE): split the context into N>=2 pieces with random skips")
    g.add_argument("--terminal-loss-weight", type=float, default=1.0, help="w > 0")
    g.add_argument("--context-loss-weight", type=float, default=1.0,
                   help="1 keeps ordinary LM loss on the context; 0 trains terminals only")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--name", default=None, metavar="NAME",
                   help="write the sidecar as PREFIX.NAME.endprompt (several layouts per corpus; "
                        "pretrain picks one with --endprompt-sidecar-name NAME)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--summary-json", action="store_true", help="print the summary as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from megatron_endprompt.compat import quiet_megatron_import_noise

    quiet_megatron_import_noise()
    from megatron_endprompt.data.preprocess import PreprocessOptions, format_summary, preprocess
    from megatron_endprompt.data.tokenizer import TokenizerSpec

    try:
        layout = LayoutConfig(
            seq_length=args.seq_length,
            target_length=args.target_length,
            placement=args.placement,
            pose_chunks=args.pose_chunks,
            terminal_loss_weight=args.terminal_loss_weight,
            context_loss_weight=args.context_loss_weight,
        )
        opts = PreprocessOptions(
            inputs=args.input,
            output_prefix=args.output_prefix,
            tokenizer=TokenizerSpec(tokenizer_type=args.tokenizer_type,
                                    tokenizer_model=args.tokenizer_model,
                                    vocab_size=args.vocab_size),
            layout=layout,
            terminal_source=args.terminal_source,
            terminal_length=args.terminal_length,
            terminal_prompts=args.terminal_prompts,
            json_keys=args.json_keys,
            append_eod=args.append_eod,
            workers=args.workers,
            seed=args.seed,
            progress=not args.no_progress,
            name=args.name,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    summary = preprocess(opts)
    if args.summary_json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary))
        from megatron_endprompt.data.sidecar import sidecar_path

        print(f"wrote {args.output_prefix}.bin, .idx, {sidecar_path(args.output_prefix, args.name)}")
    return 0


def cli() -> None:
    """Console-script entry point."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    cli()
