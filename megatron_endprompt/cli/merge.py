"""``tools/merge_endprompt.py``: merge preprocessed shards into one prefix.

    tools/merge_endprompt.py --inputs OUT_part0_of_2 OUT_part1_of_2 --output-prefix OUT
"""

from __future__ import annotations

import argparse

from megatron_endprompt import runtime
from megatron_endprompt.cli.kit import entry
from megatron_endprompt.data.prepare.merge import merge


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="merge_endprompt.py",
        description="Merge .bin/.idx (Megatron's add_index) and EndPrompt sidecars of shards "
                    "written with --partitions/--partition-index.",
    )
    p.add_argument("--inputs", nargs="+", required=True,
                   help="shard prefixes, in order (e.g. OUT_part0_of_4 ... OUT_part3_of_4)")
    p.add_argument("--output-prefix", required=True, help="writes PREFIX.bin/.idx/.endprompt")
    p.add_argument("--name", default=None,
                   help="merge the PREFIX.NAME.endprompt sidecars (default PREFIX.endprompt)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runtime.quiet()
    summary = merge(args.inputs, args.output_prefix, name=args.name)
    print(f"merged {summary['inputs']} shards: {summary['samples']:,} samples, "
          f"{summary['bin_bytes']:,} bytes of tokens")
    print(f"wrote {args.output_prefix}.bin, .idx and {summary['sidecar']}")
    return 0


cli = entry(main)


if __name__ == "__main__":
    cli()
