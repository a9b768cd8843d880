"""``tools/preprocess_endprompt.py``: JSONL -> ``PREFIX.bin/.idx`` + ``PREFIX.endprompt``.

Flag names follow Megatron-LM's ``tools/preprocess_data.py`` where they exist.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator

from megatron_endprompt import runtime
from megatron_endprompt.cli.kit import (add_layout_arguments, add_summary_arguments, entry,
                                         layout_from_args, terminal_from_args)
from megatron_endprompt.data.coverage import coverage_line
from megatron_endprompt.data.prepare.preprocess import (PreprocessOptions, format_summary,
                                                         preprocess)
from megatron_endprompt.data.sidecar.sidecar import sidecar_path
from megatron_endprompt.data.tokenize.gpt2_files import gpt2_files_only, wrapped_gpt2_files
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec
from megatron_endprompt.errors import UserError, user_errors


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
    g.add_argument("--vocab-file", default=None,
                   help="GPT2BPETokenizer vocab.json (wrapped as an HF tokenizer directory "
                        "beside the output, named in one line)")
    g.add_argument("--merge-file", default=None, help="GPT2BPETokenizer merges.txt")
    add_layout_arguments(p)
    p.add_argument("--name", default=None, metavar="NAME",
                   help="write the sidecar as PREFIX.NAME.endprompt (several layouts per corpus; "
                        "pretrain picks one with --endprompt-sidecar-name NAME)")
    add_summary_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runtime.quiet()
    if args.split_sentences:
        raise UserError("--split-sentences is not supported: EndPrompt terminals anchor a "
                        "document's context to its own continuation or tail, and sentence-level "
                        "documents would cut every sample at a sentence; drop the flag")
    if args.partitions > 1 and args.partition_index is None:
        raise UserError(f"--partitions {args.partitions} needs --partition-index I (0.."
                        f"{args.partitions - 1}): run one process per partition, then "
                        "tools/merge_endprompt.py")
    with _gpt2_files_as_hf(args) as (tokenizer_type, tokenizer_model):
        _run(args, tokenizer_type, tokenizer_model)
    return 0


def _run(args: argparse.Namespace, tokenizer_type: str, tokenizer_model: str | None) -> dict:
    """Validate the options, preprocess, print the summary (returned)."""
    with user_errors():
        terminal = terminal_from_args(args)
        layout = layout_from_args(args, terminal)
        opts = PreprocessOptions(
            inputs=args.input,
            output_prefix=args.output_prefix,
            tokenizer=TokenizerSpec(tokenizer_type=tokenizer_type,
                                    tokenizer_model=tokenizer_model,
                                    vocab_size=args.vocab_size),
            layout=layout,
            terminal=terminal,
            json_keys=args.json_keys,
            append_eod=args.append_eod,
            workers=args.workers,
            progress=not args.no_progress,
            name=args.name,
            partitions=args.partitions,
            partition_index=args.partition_index or 0,
            log_interval=args.log_interval,
            tokenizer_backend=args.tokenizer_backend,
        )
    summary = preprocess(opts)
    if args.summary_json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary))
        coverage = coverage_line(opts.prefix, summary)
        if coverage:
            print(f"layout coverage: {coverage}")
        print(f"wrote {opts.prefix}.bin, .idx, {sidecar_path(opts.prefix, args.name)}")
    return summary


@contextlib.contextmanager
def _gpt2_files_as_hf(args) -> Iterator[tuple[str, str | None]]:
    """``(--tokenizer-type, --tokenizer-model)``, or for GPT-2's ``vocab.json``/``merges.txt``
    (``GPT2BPETokenizer`` with ``--vocab-file``/``--merge-file``, or an HF directory holding
    only them) the HF directory they are wrapped into beside the output (said in one line
    once the run succeeded), removed again if the run fails (:func:`wrapped_gpt2_files`)."""
    root = os.path.dirname(os.path.abspath(args.output_prefix))
    if args.tokenizer_type == "GPT2BPETokenizer":
        if not (args.vocab_file and args.merge_file):
            raise UserError(
                "--tokenizer-type GPT2BPETokenizer needs --vocab-file vocab.json and "
                "--merge-file merges.txt (Megatron-Core would fetch 'gpt2' from the Hugging Face "
                "hub, which cannot be reached offline)")
        flag, files = "--vocab-file/--merge-file", (args.vocab_file, args.merge_file)
    elif args.tokenizer_type == "HuggingFaceTokenizer" and args.tokenizer_model and \
            os.path.isdir(args.tokenizer_model) and gpt2_files_only(args.tokenizer_model):
        flag = f"--tokenizer-model {args.tokenizer_model}"
        files = tuple(os.path.join(args.tokenizer_model, n) for n in ("vocab.json", "merges.txt"))
    else:
        yield args.tokenizer_type, args.tokenizer_model
        return
    with wrapped_gpt2_files(*files, root, flag=flag) as out:
        yield "HuggingFaceTokenizer", out
    print(f"tokenizer: GPT-2 vocab.json/merges.txt wrapped as a Hugging Face tokenizer in "
          f"{out} (train with --tokenizer-type HuggingFaceTokenizer --tokenizer-model {out})",
          file=sys.stderr, flush=True)


cli = entry(main)


if __name__ == "__main__":
    cli()
