"""``tools/inspect_endprompt.py PREFIX [--index N] [--json]``: one sample and the dataset stats.

Shows a sample's tokens (and text, when a tokenizer is given or the sidecar's recorded one
still exists), its position runs and ids, and its loss weights
(:mod:`megatron_endprompt.data.inspect_sample`).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys

from megatron_endprompt import runtime
from megatron_endprompt.cli.kit import entry
from megatron_endprompt.errors import UserError
from megatron_endprompt.data.inspect_sample import inspect_sample, render_inspection
from megatron_endprompt.data.prepare.prefix_name import resolve_prefix
from megatron_endprompt.data.sidecar.sidecar_format import REBUILD, sidecar_path
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
    p.add_argument("--eod-mask-loss", action="store_true",
                   help="show the loss mask of a run trained with --eod-mask-loss")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runtime.quiet()
    args.prefix, note = resolve_prefix(args.prefix)  # Megatron's PREFIX_text_document spelling
    if note:
        print(note, file=sys.stderr)
    for path in (args.prefix + ".bin", args.prefix + ".idx", sidecar_path(args.prefix, args.name)):
        _refuse_non_file(path)
    spec = None
    if args.tokenizer_type:
        spec = TokenizerSpec(tokenizer_type=args.tokenizer_type,
                             tokenizer_model=args.tokenizer_model)
    found = inspect_sample(args.prefix, index=args.index, name=args.name, tokenizer=spec,
                           text=not args.no_text, eod_mask_loss=args.eod_mask_loss)
    if args.json:
        print(json.dumps(found, indent=1))
    else:
        print(render_inspection(args.prefix, found))
    return 0


def _refuse_non_file(path: str) -> None:
    """An input that exists but is no regular file (a directory, a FIFO...) is named as what it
    is: the library's "not found" would contradict the listing the user sees."""
    if not os.path.exists(path) or os.path.isfile(path):
        return
    mode = os.stat(path).st_mode
    kind = next((k for test, k in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                                   (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"),
                                   (stat.S_ISBLK, "a device")) if test(mode)), "not a file")
    what = "an EndPrompt sidecar" if path.endswith(".endprompt") else "a data file"
    raise UserError(f"{path} is {kind}, not {what}; move it aside and {REBUILD}")


cli = entry(main)

if __name__ == "__main__":
    cli()
