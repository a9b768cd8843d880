"""``tools/preprocess_endprompt.py``: JSONL -> ``PREFIX.bin/.idx`` + ``PREFIX.endprompt``.

Flag names follow Megatron-LM's ``tools/preprocess_data.py`` where they exist.
"""

from __future__ import annotations

import argparse
import json
import sys

from megatron_endprompt.errors import UserError, run_cli
from megatron_endprompt.cli.build_sidecar import add_layout_arguments, layout_from_args


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
    g.add_argument("--workers", type=int, default=1,
                   help="tokenizer processes (Rust threads for an HF fast tokenizer)")
    g.add_argument("--tokenizer-backend", choices=("auto", "hf", "tiktoken"), default="auto",
                   help="auto: tiktoken for a byte-level BPE tokenizer.json that converts and "
                        "gives Megatron's ids on a probe, else HF tokenizers; hf: never "
                        "tiktoken; tiktoken: refuse the run when it cannot be used")
    g.add_argument("--append-eod", action="store_true", help="append EOD to every document")
    g.add_argument("--partitions", type=int, default=1,
                   help="cut the inputs into N line-aligned byte ranges, one process (machine) "
                        "each; with --partition-index I writes PREFIX_partI_of_N.*; merge "
                        "them with tools/merge_endprompt.py")
    g.add_argument("--partition-index", type=int, default=None,
                   help="which partition this process tokenizes (0..N-1)")
    g.add_argument("--keep-newlines", action="store_true",
                   help="accepted for Megatron parity; newlines are always kept (documents "
                        "are never split into sentences)")
    g.add_argument("--split-sentences", action="store_true",
                   help="refused: sentence-level documents would break EndPrompt terminals")
    g.add_argument("--log-interval", type=int, default=1000,
                   help="documents between progress lines when stderr is not a terminal")
    g.add_argument("--vocab-file", default=None, help="GPT2BPETokenizer vocab.json")
    g.add_argument("--merge-file", default=None, help="GPT2BPETokenizer merges.txt")
    add_layout_arguments(p)
    p.add_argument("--name", default=None, metavar="NAME",
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

    if args.split_sentences:
        raise UserError("--split-sentences is not supported: EndPrompt terminals anchor a "
                        "document's context to its own continuation or tail, and sentence-level "
                        "documents would cut every sample at a sentence; drop the flag")
    if args.tokenizer_type == "GPT2BPETokenizer":
        given = " with --vocab-file/--merge-file" if args.vocab_file or args.merge_file else ""
        raise UserError(
            f"--tokenizer-type GPT2BPETokenizer{given}: Megatron-Core builds it from the 'gpt2' "
            "Hugging Face hub entry, which cannot be reached offline; save the tokenizer as a "
            "local Hugging Face directory (tokenizer.json) and pass --tokenizer-type "
            "HuggingFaceTokenizer --tokenizer-model DIR (same ids, faster)")
    if args.partitions > 1 and args.partition_index is None:
        raise UserError(f"--partitions {args.partitions} needs --partition-index I (0.."
                        f"{args.partitions - 1}): run one process per partition, then "
                        "tools/merge_endprompt.py")
    try:
        layout = layout_from_args(args)
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
            partitions=args.partitions,
            partition_index=args.partition_index or 0,
            log_interval=args.log_interval,
            tokenizer_backend=args.tokenizer_backend,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    summary = preprocess(opts)
    if args.summary_json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary))
        from megatron_endprompt.data.coverage import coverage_line
        from megatron_endprompt.data.sidecar import sidecar_path

        coverage = coverage_line(opts.prefix, summary)
        if coverage:
            print(f"layout coverage: {coverage}")

        print(f"wrote {opts.prefix}.bin, .idx, {sidecar_path(opts.prefix, args.name)}")
    return 0


def cli() -> None:
    """Console-script entry point."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    cli()
