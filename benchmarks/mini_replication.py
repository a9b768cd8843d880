"""Mini-replication of EndPrompt's claim on a CPU, one command (``make replicate``).

    .venv/bin/python benchmarks/mini_replication.py            # full form (README), ~1 h, 2 cores
    .venv/bin/python benchmarks/mini_replication.py --smoke    # CI form: tiniest sizes, seconds

A small Llama is pretrained at a short window ``L0`` on generated documents whose end recalls a
fact stated far before it (``replication_data.py``), then extended to ``L = ratio x L0`` (RoPE
linear position interpolation, ``s = L / L0``, in every method) by:

(a) **PI only**: the base checkpoint exported with ``s``; no training.
(b) **full-length fine-tuning** at ``L``: plain data (a Megatron prefix without a sidecar ->
    contiguous positions), ``--seq-length L``; ``--endprompt-target-length 2L`` only because the
    trainer requires ``L > --seq-length``; ``--endprompt-original-length L0 --endprompt-pi-factor s``.
(c) **EndPrompt, fixed placement**: ``--placement fixed --terminal-source document-tail
    --terminal-length b``: a sample is a document's first ``a = P - b`` tokens at positions
    ``0..a-1`` and its last ``b`` tokens (the recall) at ``L-b..L-1``.
(d) **EndPrompt, random placement**: as (c), terminal start uniform in ``[a, L-b]``.
(e) **PoSE**: PoSE has no terminal anchor. Emulated with our layout as ``--pose-chunks 2
    --placement random --terminal-source continuation --terminal-length 1
    --terminal-loss-weight 1``: a contiguous window of the packed stream (PoSE's input), split
    into two context chunks with a random position skip, plus a one-token "terminal" that is
    just the next token of the same text at a random later position -- i.e. PoSE with a third,
    one-token chunk, uniform loss weights, no anchoring at ``L-1`` and no document tail.
(f) **ET(PoSE)**: (d) with ``--pose-chunks 2``: PoSE's chunked context plus the anchored tail.

Equal token budget: every fine-tuning runs the same iterations with the same tokens per
iteration -- (b) a global batch of ``2`` samples of ``L`` tokens, the others ``2 x ratio``
samples of ``P = L0`` tokens (micro-batches of equal token count: 1 x L vs ratio x L0); same LR
schedule. Everything goes through the project's own tools: preprocessing
(``cli.preprocess``), Megatron's ``pretrain`` via ``demo_train.run_pretrain`` (torchrun, 2 CPU
ranks, data parallel), the converter (``cli.convert megatron-to-hf``), the evaluator
(``cli.eval``: passkey, NIAH single-needle, sliding-window PPL at lengths up to ``L``).

Measured: *step time* = median of Megatron's logged "elapsed time per iteration (ms)" (the first
log interval, with start-up, dropped); *peak memory* = ``ru_maxrss`` of ``RUSAGE_CHILDREN`` in a
forked process that only runs torchrun: the largest resident set of any single process of the
torchrun tree (a training rank; the launcher is smaller), i.e. per-rank peak RSS, parameters,
optimizer state and Python/torch runtime included. Both relative to (b).
Results: ``benchmarks/out/mini_replication{.md,.json}`` (``--smoke``: ``*_smoke``).
Tuning knobs (documented in ``--help``): ``--terminal-length`` (b), ``--terminal-loss-weight``
(w), ``--ratio`` (s), ``--ft-iters`` / ``--base-iters`` (steps).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import resource
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import replication_data as data  # noqa: E402

from megatron_endprompt.demo_train import TINY_LLAMA, parse_losses, run_pretrain  # noqa: E402
from megatron_endprompt.errors import run_cli  # noqa: E402

METHODS = {
    "a": "PI only (no training)",
    "b": "full-length FT at L",
    "c": "EndPrompt fixed",
    "d": "EndPrompt random",
    "e": "PoSE",
    "f": "ET(PoSE)",
}

#: ``full``: the README table; ``smoke``: CI (launch overhead dominates).
SIZES = {
    "full": dict(hidden=128, ffn=352, layers=4, heads=4, groups=2, vocab=512, L0=256, ratio=8,
                 base_iters=1500, base_mb=8, ft_iters=150, terminal=64, fact_span=96,
                 base_lr=3e-3, ft_lr=1e-3, log_interval=10, lengths="256,512,1024,2048",
                 depths="0,0.25,0.5,0.75,1", samples=4, tasks="passkey,niah_single,ppl",
                 ppl_windows=8, methods="a,b,c,d,e,f"),
    "smoke": dict(hidden=64, ffn=176, layers=4, heads=4, groups=2, vocab=512, L0=128, ratio=2,
                  base_iters=2, base_mb=2, ft_iters=2, terminal=48, fact_span=32,
                  base_lr=3e-3, ft_lr=1e-3, log_interval=1, lengths="256", depths="0.5",
                  samples=1, tasks="passkey,ppl", ppl_windows=1, methods="a,c"),
}
_ELAPSED = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")


def model_flags(c: dict) -> list[str]:
    """``TINY_LLAMA`` (the demo's Llama) with this run's sizes."""
    flags = list(TINY_LLAMA)
    for flag, key in (("--hidden-size", "hidden"), ("--ffn-hidden-size", "ffn"),
                      ("--num-layers", "layers"), ("--num-attention-heads", "heads"),
                      ("--num-query-groups", "groups")):
        flags[flags.index(flag) + 1] = str(c[key])
    return flags


def _train_child(argv: list[str], log_path: str, conn) -> None:
    rc, _ = run_pretrain(argv, log_path=log_path, nproc=2)
    conn.send((rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
    conn.close()


def train(name: str, argv: list[str], work: str) -> dict:
    """One ``pretrain`` run in a forked process (so ``RUSAGE_CHILDREN`` covers only its torchrun
    tree); returns step time, peak RSS and losses. Exits on failure with the log's tail."""
    log_path = os.path.join(work, f"train_{name}.log")
    print(f"[{name}] torchrun --nproc_per_node 2 -m megatron_endprompt.training.pretrain ... "
          f"(log: {log_path})", flush=True)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    t0 = time.time()
    proc = ctx.Process(target=_train_child, args=(argv, log_path, child))
    proc.start()
    rc, maxrss_kib = parent.recv()
    proc.join()
    wall = time.time() - t0
    with open(log_path, encoding="utf-8") as f:
        text = f.read()
    losses = parse_losses(text)
    if rc != 0 or not losses:
        tail = "\n".join(text.splitlines()[-20:])
        raise SystemExit(f"error: training {name} failed (exit {rc}); {log_path}:\n{tail}")
    times = [float(t) for t in _ELAPSED.findall(text)]
    step_ms = statistics.median(times[1:] if len(times) > 1 else times)
    print(f"[{name}] done in {wall:.0f} s: step {step_ms:.0f} ms, peak RSS "
          f"{maxrss_kib / 1024:.0f} MiB, loss {losses[min(losses)]:.3f} -> "
          f"{losses[max(losses)]:.3f}", flush=True)
    return {"step_ms": step_ms, "peak_rss_mib": maxrss_kib / 1024, "wall_s": round(wall, 1),
            "losses": {str(k): v for k, v in sorted(losses.items())}}


def tool(main, argv: list[str]) -> None:
    print(f"$ {main.__module__.split('.')[-1]} {' '.join(argv)}", flush=True)
    rc = run_cli(main, argv)
    if rc:
        raise SystemExit(f"error: {main.__module__} exited {rc}")


def train_argv(c: dict, spm: str, work: str, *, seq: int, target: int, pi: float, mb: int,
               gbs: int, iters: int, lr: float, data_prefix: str, save: str,
               load: str | None, save_interval: int | None = None,
               replay: bool = False) -> list[str]:
    warm = max(1, min(20, iters // 10))
    argv = [
        *model_flags(c), "--seq-length", str(seq), "--max-position-embeddings", str(seq),
        "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", spm,
        "--data-path", data_prefix, "--split", "90,5,5",
        "--data-cache-path", os.path.join(work, "index_cache"),
        # plain data (base pretraining, full-length fine-tuning) is replay by name
        *(["--endprompt-replay-prefixes", data_prefix] if replay else []),
        "--endprompt-target-length", str(target), "--endprompt-original-length", str(c["L0"]),
        "--endprompt-pi-factor", f"{pi:g}",
        "--micro-batch-size", str(mb), "--global-batch-size", str(gbs),
        "--train-iters", str(iters), "--lr", str(lr), "--min-lr", str(lr / 10),
        "--lr-decay-style", "cosine", "--lr-warmup-iters", str(warm), "--weight-decay", "0.01",
        "--clip-grad", "1.0", "--seed", "1234", "--calculate-per-token-loss",
        "--log-interval", str(c["log_interval"]), "--eval-interval", str(iters),
        "--eval-iters", "1", "--num-workers", "0", "--save", save,
        "--save-interval", str(save_interval or iters), "--ckpt-format", "torch_dist",
    ]
    if load:
        argv += ["--load", load, "--finetune"]
    return argv


def layout_flags(method: str, c: dict, w: float) -> list[str]:
    b = str(c["terminal"])
    tail = ["--terminal-source", "document-tail", "--terminal-length", b,
            "--terminal-loss-weight", f"{w:g}"]
    return {"c": ["--placement", "fixed", *tail],
            "d": ["--placement", "random", *tail],
            "e": ["--placement", "random", "--pose-chunks", "2", "--terminal-source",
                  "continuation", "--terminal-length", "1", "--terminal-loss-weight", "1"],
            "f": ["--placement", "random", "--pose-chunks", "2", *tail]}[method]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CI form: tiniest sizes, few iterations")
    p.add_argument("--methods", default=None, help="comma list of a..f (default: all; "
                                                   "--smoke: a,c)")
    p.add_argument("--workdir", default=None, help="default benchmarks/out/mini_replication_work"
                                                   " (_smoke)")
    p.add_argument("--out", default=None, help="result JSON (the .md goes beside it)")
    p.add_argument("--base-iters", type=int, default=None, help="pretraining steps at L0")
    p.add_argument("--ft-iters", type=int, default=None, help="fine-tuning steps (all methods)")
    p.add_argument("--ratio", type=int, default=None, help="s = L / L0 (default 8)")
    p.add_argument("--terminal-length", type=int, default=None, help="EndPrompt b (default 64)")
    p.add_argument("--terminal-loss-weight", type=float, default=1.0, help="EndPrompt w")
    p.add_argument("--samples", type=int, default=None, help="eval prompts per length x depth")
    p.add_argument("--reuse-base", action="store_true",
                   help="keep an existing base checkpoint and data in --workdir (for sweeps)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    c = dict(SIZES["smoke" if args.smoke else "full"])
    for key, val in (("methods", args.methods), ("base_iters", args.base_iters),
                     ("ft_iters", args.ft_iters), ("ratio", args.ratio),
                     ("terminal", args.terminal_length), ("samples", args.samples)):
        if val is not None:
            c[key] = val
    methods = [m for m in c["methods"].split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise SystemExit(f"error: --methods: unknown {bad}; choose from {','.join(METHODS)}")
    suffix = "_smoke" if args.smoke else ""
    here = os.path.dirname(os.path.abspath(__file__))
    work = os.path.abspath(args.workdir or os.path.join(here, "out",
                                                        f"mini_replication_work{suffix}"))
    out_json = os.path.abspath(args.out or os.path.join(here, "out",
                                                        f"mini_replication{suffix}.json"))
    L0, ratio = c["L0"], c["ratio"]
    L, P = L0 * ratio, L0
    os.makedirs(work, exist_ok=True)
    os.makedirs(os.path.dirname(out_json), exist_ok=True)
    w = lambda *p: os.path.join(work, *p)  # noqa: E731
    timings: dict[str, float] = {}
    t_all = time.time()

    from megatron_endprompt.compat import quiet_megatron_import_noise

    quiet_megatron_import_noise()
    # --- data ---------------------------------------------------------------------------
    t0 = time.time()
    base_ckpt = w("ckpt_base")
    reuse = args.reuse_base and os.path.exists(os.path.join(base_ckpt,
                                                            "latest_checkpointed_iteration.txt"))
    spm = w("tokenizer.model")
    gbs_long, gbs_short = 2, 2 * ratio
    if not reuse:
        spm = data.make_tokenizer(work, vocab_size=c["vocab"],
                                  num_docs=150 if args.smoke else 600)
        count = data.token_counter(spm)
        lo = max(64, L0 // 4)
        base_docs = int(c["base_iters"] * c["base_mb"] * 2 * L0 * 1.15 / ((lo + L0) / 2)) + 60
        data.write_docs(w("base.jsonl"), num_docs=base_docs, min_tokens=lo, max_tokens=L0,
                        seed=11, count=count, fact_span=None)
        ft_docs = int(c["ft_iters"] * gbs_short * 1.15) + 60  # one document-tail sample each
        data.write_docs(w("ft.jsonl"), num_docs=ft_docs, min_tokens=P + 8, max_tokens=L,
                        seed=12, count=count, fact_span=c["fact_span"])
        data.write_docs(w("ppl.jsonl"), num_docs=max(8, 4 * L // L0), min_tokens=L // 2,
                        max_tokens=L, seed=13, count=count, fact_span=c["fact_span"])
        ntok = {"base": data.write_plain_prefix(w("base.jsonl"), w("base_plain"), spm),
                "ft": data.write_plain_prefix(w("ft.jsonl"), w("ft_plain"), spm)}
        print(f"data: {base_docs} base documents ({ntok['base']} tokens), {ft_docs} "
              f"fine-tuning documents ({ntok['ft']} tokens)", flush=True)
    from megatron_endprompt.cli import convert, preprocess
    from megatron_endprompt.cli import eval as evaluate

    for m in methods:
        if m in "cdef":
            tool(preprocess.main, ["--input", w("ft.jsonl"), "--output-prefix", w(f"ft_{m}"),
                                   "--tokenizer-type", "GPTSentencePieceTokenizer",
                                   "--tokenizer-model", spm, "--seq-length", str(P),
                                   "--target-length", str(L), "--append-eod", "--workers", "2",
                                   "--no-progress", *layout_flags(m, c, args.terminal_loss_weight)])
    timings["data_s"] = time.time() - t0

    # --- base pretraining at L0 (plain data, s = 1) -------------------------------------
    results: dict = {"config": {**c, "L": L, "P": P, "terminal_loss_weight":
                                args.terminal_loss_weight, "methods": methods,
                                "gbs_full_length": gbs_long, "gbs_short": gbs_short},
                     "methods": {}}
    if reuse and os.path.exists(out_json):  # keep the earlier run's base figures
        with open(out_json, encoding="utf-8") as f:
            results["base"] = json.load(f).get("base")
    if not reuse:
        shutil.rmtree(base_ckpt, ignore_errors=True)
        results["base"] = train("base", train_argv(
            c, spm, work, seq=L0, target=2 * L0, pi=1.0, mb=c["base_mb"],
            gbs=2 * c["base_mb"], iters=c["base_iters"], lr=c["base_lr"],
            data_prefix=w("base_plain"), save=base_ckpt, load=None, replay=True,
            save_interval=min(c["base_iters"], 300)), work)
    timings["base_train_s"] = time.time() - t0 - timings["data_s"]

    # --- methods ------------------------------------------------------------------------
    for m in methods:
        t1 = time.time()
        entry: dict = {"name": METHODS[m]}
        ckpt = base_ckpt
        if m != "a":
            ckpt = w(f"ckpt_{m}")
            shutil.rmtree(ckpt, ignore_errors=True)
            if m == "b":
                kw = dict(seq=L, target=2 * L, mb=1, gbs=gbs_long, data_prefix=w("ft_plain"),
                          replay=True)
            else:
                kw = dict(seq=P, target=L, mb=ratio, gbs=gbs_short, data_prefix=w(f"ft_{m}"))
            entry.update(train(m, train_argv(c, spm, work, pi=float(ratio), iters=c["ft_iters"],
                                             lr=c["ft_lr"], save=ckpt, load=base_ckpt, **kw),
                               work))
            entry["tokens_trained"] = c["ft_iters"] * kw["gbs"] * kw["seq"]
        else:
            entry["tokens_trained"] = 0
        hf = w(f"hf_{m}")
        tool(convert.main, ["megatron-to-hf", "--checkpoint", ckpt, "--output", hf,
                            "--target-length", str(L), "--pi-factor", str(float(ratio)),
                            "--overwrite", "--no-progress"])
        ev = w(f"eval_{m}.json")
        # the published table used the pre-RULER prompts and the stream PPL: name them
        legacy = ",".join(f"legacy_{t}" if t in ("passkey", "niah_single") else t
                          for t in c["tasks"].split(","))
        tool(evaluate.main, ["--hf-dir", hf, "--tasks", legacy, "--lengths", c["lengths"],
                             "--depths", c["depths"], "--samples", str(c["samples"]),
                             "--seed", "1234", "--device", "cpu", "--batch-size", "4",
                             "--ppl-data", w("ppl.jsonl"), "--ppl-max-windows",
                             str(c["ppl_windows"]), "--ppl-protocol", "legacy-stream",
                             "--output", ev, "--no-progress"])
        with open(ev, encoding="utf-8") as f:
            entry["eval"] = _eval_summary(json.load(f))
        entry["wall_s"] = round(time.time() - t1, 1)
        results["methods"][m] = entry
        print(f"[{m}] {METHODS[m]}: {entry['wall_s']:.0f} s in all", flush=True)

    timings["total_s"] = time.time() - t_all
    results["timings_s"] = {k: round(v, 1) for k, v in timings.items()}
    table = markdown(results)
    print("\n" + table)
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    md = os.path.splitext(out_json)[0] + ".md"
    with open(md, "w", encoding="utf-8") as f:
        f.write(table + "\n")
    print(f"wrote {out_json} and {md}")
    return 0


def _eval_summary(ev: dict) -> dict:
    """Accuracy per task and length (fractions), PPL per length, from the eval tool's JSON."""
    out = {task.removeprefix("legacy_"): {n: None if v is None else v / 100
                                          for n, v in s["scores"].items()}
           for task, s in ev.get("tasks", {}).items()}
    if "ppl" in ev:
        out["ppl"] = {n: (e["ppl"] if e else None) for n, e in ev["ppl"]["by_length"].items()}
    return out


def markdown(results: dict) -> str:
    """One table: method, tokens, step time and peak RSS relative to (b), accuracies, PPL."""
    cfg = results["config"]
    lengths = [n for n in cfg["lengths"].split(",")]
    ms = results["methods"]
    ref = ms.get("b", {})
    tasks = [t for t in ("passkey", "niah_single") if t in cfg["tasks"]]
    short = {"passkey": "passkey", "niah_single": "NIAH"}
    head = ["method", "tokens", "step ms", "step vs (b)", "peak RSS MiB", "RSS vs (b)"]
    head += [f"{short[t]} {n}" for t in tasks for n in lengths]
    head += [f"PPL {n}" for n in lengths] if "ppl" in cfg["tasks"] else []
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def rel(e: dict, key: str) -> str:
        return f"{e[key] / ref[key]:.2f}x" if key in e and key in ref else "-"
    for m, e in ms.items():
        cells = [f"({m}) {e['name']}", f"{e['tokens_trained']:,}",
                 f"{e['step_ms']:.0f}" if "step_ms" in e else "-", rel(e, "step_ms"),
                 f"{e['peak_rss_mib']:.0f}" if "peak_rss_mib" in e else "-",
                 rel(e, "peak_rss_mib")]
        for t in tasks:
            acc = e["eval"].get(t, {})
            cells += [("n/a" if acc.get(n) is None else f"{100 * acc[n]:.0f}") for n in lengths]
        if "ppl" in cfg["tasks"]:
            ppl = e["eval"].get("ppl", {})
            cells += [("n/a" if ppl.get(n) is None else f"{ppl[n]:.2f}") for n in lengths]
        rows.append("| " + " | ".join(cells) + " |")
    base = results.get("base")
    note = (f"\nL0={cfg['L0']}, L={cfg['L']} (s={cfg['ratio']}), {cfg['ft_iters']} fine-tuning "
            f"steps per method (global batch {cfg['gbs_full_length']} x {cfg['L']} tokens for "
            f"(b), {cfg['gbs_short']} x {cfg['P']} for the others), EndPrompt b="
            f"{cfg['terminal']}, w={cfg['terminal_loss_weight']:g}; accuracy in % over "
            f"{cfg['samples']} prompt(s) x depths {cfg['depths']}; PPL on held-out documents "
            f"(sliding window, {cfg['ppl_windows']} window(s) per length).")
    if base:
        note += (f" Base: {cfg['base_iters']} steps at L0, step {base['step_ms']:.0f} ms, "
                 f"final loss {list(base['losses'].values())[-1]:.3f}.")
    note += f" Wall time: {results['timings_s'].get('total_s', 0) / 60:.1f} min."
    return "\n".join(rows) + "\n" + note


if __name__ == "__main__":
    sys.exit(main())
