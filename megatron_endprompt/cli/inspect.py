"""``tools/inspect_endprompt.py PREFIX [--index N] [--json]``: one sample and the dataset stats.

Shows a sample's tokens (and text, when a tokenizer is given or the sidecar's recorded one
still exists), its position runs and ids, and its loss weights.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from megatron_endprompt.data.prefix_name import resolve_prefix
from megatron_endprompt.errors import UserError, run_cli


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


def _compact(values: np.ndarray) -> str:
    """``0..4095, 61440..65535`` for runs of consecutive integers."""
    out, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[i - 1] + 1:
            a, b = int(values[start]), int(values[i - 1])
            out.append(f"{a}..{b}" if b > a else f"{a}")
            start = i
    return ", ".join(out)


def _tokenizer(args, header) -> object | None:
    from megatron_endprompt.data.tokenizer import TokenizerSpec, build_tokenizer, json_detokenizer

    if args.no_text:
        return None
    if args.tokenizer_type:
        spec = TokenizerSpec(tokenizer_type=args.tokenizer_type,
                             tokenizer_model=args.tokenizer_model)
    else:
        rec = header.tokenizer
        if not rec or (rec.get("tokenizer_model") and not os.path.exists(rec["tokenizer_model"])):
            return None
        light = json_detokenizer(rec)  # the recorded vocabulary, without torch/Megatron
        if light is not None:
            return light
        spec = TokenizerSpec(tokenizer_type=rec["tokenizer_type"],
                             tokenizer_model=rec.get("tokenizer_model"),
                             vocab_size=rec.get("vocab_size"))
    return build_tokenizer(spec)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from megatron_endprompt.compat import quiet_megatron_import_noise

    quiet_megatron_import_noise()
    from megatron_endprompt.data.atomic_output import ensure_committed
    from megatron_endprompt.data.sidecar import read_sidecar, sidecar_path
    from megatron_endprompt.data.spans import sample_reader
    from megatron_endprompt.layout import describe_runs, loss_weights_from_record, \
        positions_from_record

    prefix, note = resolve_prefix(args.prefix)  # Megatron's PREFIX_text_document spelling
    if note:
        print(note, file=sys.stderr)
    ensure_committed(prefix, flag="inspect")  # roll an interrupted preprocessing commit forward
    for suffix in (".bin", ".idx"):
        if not os.path.isfile(prefix + suffix):
            raise UserError(f"{prefix}{suffix}: not found; give the prefix used with "
                            "--output-prefix")
    sidecar = read_sidecar(sidecar_path(prefix, args.name), prefix=prefix)
    header, layout = sidecar.header, sidecar.layout
    n = header.num_samples
    if not 0 <= args.index < n:
        raise UserError(f"--index {args.index} out of range; {prefix} has {n} samples (0..{n - 1})")
    tokens = np.asarray(sample_reader(prefix, sidecar)(args.index), dtype=np.int64)
    P = layout.seq_length
    record = np.asarray(sidecar.records[args.index])
    positions = positions_from_record(record, P)
    weights = loss_weights_from_record(record, P, context_weight=layout.context_loss_weight,
                                       terminal_weight=layout.terminal_loss_weight,
                                       predict_after_terminal=header.terminal_source != "prompt")
    a = int(record[0])
    tok = _tokenizer(args, header)
    vocab = getattr(tok, "vocab_size", None) if tok is not None else None
    if vocab is not None and int(tokens.max()) >= vocab:
        model = args.tokenizer_model or header.tokenizer.get("tokenizer_model")
        raise UserError(f"--tokenizer-model {model}: vocabulary {vocab}, but sample "
                        f"{args.index} holds token id {int(tokens.max())} (the data was "
                        f"tokenized with {header.tokenizer.get('tokenizer_type')} of vocabulary "
                        f"{header.tokenizer.get('vocab_size')}); use that tokenizer or --no-text")
    terminal_starts = sidecar.records[:, 1]
    stats = {
        "samples": n,
        "bin_bytes": header.bin_bytes,
        "sidecar_bytes": os.path.getsize(sidecar.path),
        "layout": header.layout,
        "terminal_source": header.terminal_source,
        "terminal_length": header.terminal_length,
        "prompts": header.prompts,
        "seed": header.seed,
        "tokenizer": header.tokenizer,
        "terminal_start_min_mean_max": [int(terminal_starts.min()), float(terminal_starts.mean()),
                                        int(terminal_starts.max())],
        "preprocessing": header.stats,
    }
    sample = {
        "index": args.index,
        "context_length": a,
        "terminal_length": P - a,
        "runs": [dict(token_offset=o, first_position=s, length=ln)
                 for o, s, ln in describe_runs(record, P)],
        "tokens": tokens[:P].tolist(),
        "label_token": int(tokens[P]),
        "position_ids": positions.tolist(),
        "loss_weights": weights.tolist(),
    }
    if tok is not None:
        sample["context_text"] = tok.detokenize(tokens[:a].tolist())
        sample["terminal_text"] = tok.detokenize(tokens[a:P].tolist())
    if args.json:
        print(json.dumps({"stats": stats, "sample": sample}, indent=1))
        return 0
    print(f"{prefix}: {n:,} samples, P={P}, L={layout.target_length}, "
          f"placement={layout.placement}, source={header.terminal_source}, "
          f"pose_chunks={layout.pose_chunks}, w={layout.terminal_loss_weight}, "
          f"context weight={layout.context_loss_weight}")
    print(f"sidecar: {stats['sidecar_bytes']:,} bytes = "
          f"{100 * stats['sidecar_bytes'] / max(header.bin_bytes, 1):.4f}% of .bin; terminal "
          f"start min/mean/max {stats['terminal_start_min_mean_max']}")
    print(f"sample {args.index}: context a={a}, terminal b={P - a}")
    for run in sample["runs"]:
        print(f"  tokens {run['token_offset']}..{run['token_offset'] + run['length'] - 1} -> "
              f"positions {run['first_position']}..{run['first_position'] + run['length'] - 1}")
    print(f"position_ids: {_compact(positions)}")
    values, first = np.unique(weights, return_index=True)
    print("loss weights: " + ", ".join(f"{v:g} from token {i}" for v, i in
                                       sorted(zip(values.tolist(), first.tolist()), key=lambda x: x[1])))
    print(f"tokens[:16]: {tokens[:16].tolist()}  terminal tokens[:16]: {tokens[a:min(a + 16, P)].tolist()}")
    if tok is not None:
        ctx = sample["context_text"]
        print(f"context text: {ctx[:300]!r}{' ...' if len(ctx) > 300 else ''}")
        print(f"terminal text: {sample['terminal_text']!r}")
    return 0


def cli() -> None:
    """Console-script entry point."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    cli()
