"""Command line of ``benchmarks/replication/mini_replication.py`` (kept apart so that file
stays short)."""

from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``mini_replication.py`` (overrides name a key of its ``SIZES``)."""
    p = argparse.ArgumentParser(description="Mini-replication of EndPrompt's claim on a CPU.")
    p.add_argument("--smoke", action="store_true", help="CI form: tiniest sizes, few iterations")
    p.add_argument("--methods", default=None,
                   help="comma list of a..h, d0, a1, g1p, g1n "
                   "(default: all; --smoke: f, every layout checked)")
    p.add_argument("--seeds", type=int, default=1, help="fine-tuning seeds per method")
    p.add_argument("--sweep", action="store_true",
                   help="also sweep b, w and s on the best placement, on every --seeds seed, "
                   "paired with the main table's runs: second table")
    p.add_argument("--workdir", default=None, help="default benchmarks/out/mini_replication_work"
                                                   " (_smoke); the base checkpoint is cached "
                                                   "there")
    p.add_argument("--out", default=None, help="result JSON (.md and .png go beside it)")
    p.add_argument("--length-grid", default=None, metavar="L,L,...",
                   help="run the whole protocol once per target length (e.g. 640,1280,2560: "
                        "s = L / L0), evaluated at L/2 and L; RESULT_L<L>.json each")
    p.add_argument("--resume", action="store_true",
                   help="reuse finished method runs of the same configuration in --workdir")
    p.add_argument("--split-digits", action=argparse.BooleanOptionalAction, default=None,
                   help="SentencePiece split_digits (a digit per token, as Llama-2; the "
                        "default): the base then retrieves ~100%% at L0; --no-split-digits: "
                        "merged digit groups, the earlier published base "
                        "(benchmarks/replication/README.md, Archive)")
    p.add_argument("--rerender", default=None, metavar="RESULTS.json",
                   help="recompute the summaries and paired differences (protocol.PAIRS) of a "
                        "results JSON and rewrite it with its tables and figure; trains nothing")
    p.add_argument("--held-out", dest="held_out", default=None, metavar="TASK,TASK",
                   help="held-out RULER tasks evaluated besides NIAH and passkey (default: "
                        "niah_multikey_2,niah_multivalue,niah_multiquery; \"\" for none, which "
                        "halves each run's evaluation)")
    for flag, key, typ in (("--base-iters", "base_iters", int), ("--ft-iters", "ft_iters", int),
                           ("--ft-lr", "ft_lr", float), ("--ft-docs", "ft_docs", int),
                           ("--pi-factor", "ratio", int), ("--terminal-length", "terminal", int),
                           ("--target-length", "L", int), ("--seq-length", "P", int),
                           ("--fact-span", "fact_span", int), ("--base-lr", "base_lr", float),
                           ("--ft-warmup", "ft_warmup", int), ("--ft-min-tokens", "ft_min", int),
                           ("--terminal-loss-weight", "w", float),
                           ("--samples", "samples", int), ("--lengths", "lengths", str)):
        p.add_argument(flag, dest=key, type=typ, default=None, help=f"override {key}")
    return p
