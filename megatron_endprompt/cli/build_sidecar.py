"""``tools/build_endprompt_sidecar.py``: an EndPrompt sidecar for an existing ``.bin/.idx``.

The corpus is read, never rewritten; the sidecar goes beside it (``PREFIX.endprompt`` or
``PREFIX.NAME.endprompt`` with ``--name``), so one tokenized corpus serves many layouts.
"""

from __future__ import annotations

import argparse
import json
import sys

from megatron_endprompt import runtime
from megatron_endprompt.cli.kit import (add_layout_arguments, add_summary_arguments, entry,
                                         layout_from_args, terminal_from_args)
from megatron_endprompt.data.prepare.build_sidecar import SidecarOptions, build_sidecar
from megatron_endprompt.data.coverage import coverage_line
from megatron_endprompt.data.prepare.prefix_name import resolve_prefix
from megatron_endprompt.data.sidecar.sidecar import sidecar_path
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec
from megatron_endprompt.errors import user_errors


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
    add_summary_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runtime.quiet()
    args.data_prefix, note = resolve_prefix(args.data_prefix)
    if note:
        print(note, file=sys.stderr)
    spec = None
    if args.tokenizer_type:
        spec = TokenizerSpec(tokenizer_type=args.tokenizer_type,
                             tokenizer_model=args.tokenizer_model, vocab_size=args.vocab_size)
    with user_errors():
        terminal = terminal_from_args(args)
        opts = SidecarOptions(
            data_prefix=args.data_prefix, layout=layout_from_args(args, terminal),
            terminal=terminal, tokenizer=spec, name=args.name, progress=not args.no_progress)
    summary = build_sidecar(opts)
    if args.summary_json:
        print(json.dumps(summary, indent=2))
    else:
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


cli = entry(main)


if __name__ == "__main__":
    cli()
