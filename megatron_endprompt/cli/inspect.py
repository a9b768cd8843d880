"""``tools/inspect_endprompt.py PREFIX [--index N] [--json]``: one sample and the dataset stats.

Shows a sample's tokens (and text, when a tokenizer is given or the sidecar's recorded one
still exists), its position runs and ids, and its loss weights
(:mod:`megatron_endprompt.data.inspect_sample`).
"""

from __future__ import annotations

import argparse
import json
import sys

from megatron_endprompt import runtime
from megatron_endprompt.cli.kit import entry
from megatron_endprompt.data.inspect_sample import inspect_sample, render_inspection
from megatron_endprompt.data.prepare.prefix_name import resolve_prefix
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inspect_endprompt.py", description=__doc__.splitlines()[0])
    p.add_argument("prefix", help="data prefix (PREFIX.bin/.idx/.endprompt)")
    p.add_argument("--index", type=int, default=0, help="sample to show (default 0)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--tokenizer-type", default=None, help="detokenize with this tokenizer")
    p.add_argument("--tokenizer-model", default=None)
    p.add_argument("--no-text", action="store_true", help="do not detokenize")
    p.add_argument("--name", default=None, metavar="NAME",
                   help="inspect the named sidecar PREFIX.NAME.endprompt")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runtime.quiet()
    args.prefix, note = resolve_prefix(args.prefix)  # Megatron's PREFIX_text_document spelling
    if note:
        print(note, file=sys.stderr)
    spec = None
    if args.tokenizer_type:
        spec = TokenizerSpec(tokenizer_type=args.tokenizer_type,
                             tokenizer_model=args.tokenizer_model)
    found = inspect_sample(args.prefix, index=args.index, name=args.name, tokenizer=spec,
                           text=not args.no_text)
    if args.json:
        print(json.dumps(found, indent=1))
    else:
        print(render_inspection(args.prefix, found))
    return 0


cli = entry(main)

if __name__ == "__main__":
    cli()
