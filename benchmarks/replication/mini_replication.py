"""Mini-replication of EndPrompt's claim on a CPU, one command (``make replicate``).

    .venv/bin/python -m benchmarks.replication.mini_replication          # one seed, main table
    .venv/bin/python -m benchmarks.replication.mini_replication --seeds 3 --sweep  # full run
    .venv/bin/python -m benchmarks.replication.mini_replication --smoke  # CI form (< 1 min):
                                                      # (f) trained, every layout checked

A small Llama is pretrained once at a short window ``L0`` on generated documents whose end
recalls a fact stated before it (``data.py``; the base is cached in the work
directory and reused by every seed and method), then extended to ``L = s x L0`` with linear
position interpolation ``s`` in every method, from the same fine-tuning documents (``P`` to
``L - 1`` tokens + EOD, uniformly; the fact in the first ``fact_span`` tokens, the recall at
the end), with the same number of optimizer steps and the same number of samples (one per
document) per step. The lengths vary so that full-length fine-tuning sees fact-recall
distances from ~``P`` to ``L``: with every document ``L - 1`` long it saw only ~``L`` and lost
retrieval at ``L0`` (``benchmarks/replication/README.md``, Archive).

(a) **PI only**: the base checkpoint exported with ``s``; no training.
(b) **full-length fine-tuning**: each document whole, one per sequence of ``L`` tokens (plain
    prefix, contiguous positions, EOD padding masked by ``--eod-mask-loss``;
    ``--endprompt-target-length 2L`` only because the trainer requires ``L > --seq-length``).
(c) **EndPrompt fixed**: ``--terminal-source document-tail --placement fixed``: a document's
    first ``a = P - b`` tokens at ``0..a-1`` and its last ``b`` tokens (the recall) at
    ``L-b..L-1``.
(d) **EndPrompt random**: as (c), the terminal starting uniformly in ``[a, L-b]``.
(e) **PoSE** as PoSE's ``train_pose.py`` (``pose.py``, cited there): per
    document, a first chunk of ``U{1..ceil(P/2)}`` tokens, then -- after a text skip of
    ``U{0..n-P}`` tokens and a position skip of ``U{0..L-P}`` -- the rest of the ``P``-token
    window; uniform loss, no anchoring (the archived two-piece (e) had no text skip).
(f) **(d) + the project's two-piece chunks**: (d) with ``--pose-chunks 2`` (not the paper's
    ET(PoSE): the project's own chunk law and the document-tail terminal).
(g) **EndPrompt, prompt terminal**: ``--terminal-source prompt --placement fixed``, the
    built-in EP1-EP3 set, ``w = 0.1``: ``P``-token windows of the stream closed by a prompt.
(h) **full-length fine-tuning at equal tokens** (the second view): (b) with
    ``ft_docs x P / L`` documents per step, the tokens per step of (c)-(g), EOD-padded.
(hd) / (hg) **full-length fine-tuning at equal tokens, the paper's baseline**: the document
    stream of (d) / of (g1p) packed into ``L``-token windows (Megatron's packing, no padding),
    ``ft_docs x P / L`` windows per step: the tokens per step and steps of the ``P``-token rows.

(g) trains on ``P``-token windows of the documents' stream, which rarely hold a fact and its
recall; (e) on one PoSE sample per document (its fact, in the first chunk only when
``r1`` reaches it; its recall, in the second only when the text skip leaves it at the end).
Controls (d0), (a1), (g1p), (g1n), (g1nP): ``controls.py``; the paired-by-seed differences of
``protocol.PAIRS`` go to ``results["paired"]``; what each row's data holds (documents per
step, whole documents per sample): ``data_stats.py``. With ``--seeds N > 1`` the JSON, tables
and figure of the seeds done so far are written after each seed (``*_partial``).

Everything goes through the project's own tools (preprocessing, ``pretrain`` under torchrun
with 2 CPU ranks, the converter, the evaluator: RULER ``niah_single_1`` and landmark passkey,
``samples`` prompts per cell, per-document PPL). Base row: the base exported with ``s = 1``.
Statistics: ``stats.py``; tables and figure: ``report.py``. Results:
``benchmarks/out/mini_replication{.json,.md,.png}`` (``--smoke``: ``*_smoke``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

from benchmarks.paths import OUT
from benchmarks.replication import controls
from benchmarks.replication import data
from benchmarks.replication import data_stats
from benchmarks.replication import layouts
from benchmarks.replication import pose
from benchmarks.replication import report
from benchmarks.replication import run
from benchmarks.replication import stats
from benchmarks.replication import sweep
from megatron_endprompt.disk import atomic_path

from benchmarks.replication.args import build_parser  # noqa: F401 - mini.build_parser stays

from benchmarks.replication.protocol import BASE_KEYS, BASE_SAVE_EVERY, EVAL_KEYS  # noqa: F401
from benchmarks.replication.protocol import EQUAL_TOKENS, METHODS, PAIRS, ROWS  # noqa: F401
from benchmarks.replication.protocol import SIZES  # noqa: F401


class Replication:
    """The runs of one invocation, sharing a work directory, a base and the documents."""

    def __init__(self, c: dict, work: str, resume: bool):
        self.c, self.work, self.resume = c, work, resume
        self.L0, self.L, self.P = c["L0"], c["L"], c["P"]
        self.spm = self.path("tokenizer.model")

    def path(self, *p: str) -> str:
        """A path in the work directory."""
        return os.path.join(self.work, *p)

    def reuse(self, path: str, sig: dict, tag: str) -> dict | None:
        """With ``--resume``: the JSON stored at ``path`` if it was made under ``sig``."""
        if not (self.resume and os.path.exists(path)):
            return None
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
        if entry.get("sig") != sig:
            return None
        print(f"[{tag}] reusing {path}", flush=True)
        return entry

    def base(self) -> dict:
        """Tokenizer, base documents and the base checkpoint, cached under their config.
        Pretraining runs ``base_iters`` steps, then each of ``base_more`` as a further stage
        from the previous one (``--finetune``: a fresh LR schedule, new documents)."""
        c = self.c
        key: dict = {k: c[k] for k in BASE_KEYS}
        stages = [("ckpt_base", "base_stamp.json", c["base_iters"], None)]
        for j, iters in enumerate(c["base_more"], 1):
            stages.append((f"ckpt_base_more{j}", f"base_more{j}_stamp.json", iters,
                           stages[-1][0]))
        trains = []
        for j, (ckpt, stamp_name, iters, load) in enumerate(stages):
            if j:
                key = {**key, "more": c["base_more"][:j]}
            stamp = self.path(stamp_name)
            self.base_ckpt = self.path(ckpt)
            if os.path.exists(stamp):
                with open(stamp, encoding="utf-8") as f:
                    cached = json.load(f)
                if cached["key"] == key:
                    print(f"base: reusing {self.base_ckpt} (same configuration)", flush=True)
                    trains.append(cached["train"])
                    continue
            trains.append(self._base_stage(j, ckpt, iters, load, key))
            with open(stamp, "w", encoding="utf-8") as f:
                json.dump({"key": key, "train": trains[-1]}, f)
        out = dict(trains[-1])
        out["stages"] = [{k: t[k] for k in ("step_ms", "train_wall_s")} for t in trains]
        out["train_wall_s"] = round(sum(t["train_wall_s"] for t in trains), 1)
        return out

    def _base_stage(self, j: int, ckpt: str, iters: int, load: str | None, key: dict) -> dict:
        """One pretraining stage; with ``--resume``, one interrupted under the same ``key``
        continues from its last save (every ``BASE_SAVE_EVERY`` steps)."""
        c = self.c
        partial = self.path(f"{ckpt}.partial.json")
        tracker = self.path(ckpt, "latest_checkpointed_iteration.txt")
        if self.resume and os.path.exists(tracker) and os.path.exists(partial):
            with open(partial, encoding="utf-8") as f:
                if json.load(f) == key:
                    print(f"base: continuing {self.path(ckpt)} from its last save", flush=True)
                    log = self.path(f"train_{'base' if j == 0 else f'base_more{j}'}.log")
                    if os.path.exists(log):  # the interrupted part's log (times, losses) stays
                        os.replace(log, f"{log}.before-{int(time.time())}")
                    return self._base_train(j, ckpt, iters, self.path(ckpt), finetune=False)
        shutil.rmtree(self.path(ckpt), ignore_errors=True)
        with open(partial, "w", encoding="utf-8") as f:
            json.dump(key, f)
        if j == 0:
            data.make_tokenizer(self.work, vocab_size=c["vocab"], num_docs=600,
                                split_digits=c["split_digits"])
        count = data.token_counter(self.spm)
        lo = max(64, self.L0 // 4)
        n_docs = int(iters * c["base_mb"] * 2 * self.L0 * 1.1 / ((lo + self.L0) / 2)) + 60
        name = "base" if j == 0 else f"base_more{j}"
        data.write_docs(self.path(f"{name}.jsonl"), num_docs=n_docs, min_tokens=lo,
                        max_tokens=self.L0, seed=11 + 10 * j, count=count, fact_span=None)
        ntok = data.write_plain_prefix(self.path(f"{name}.jsonl"), self.path(f"{name}_plain"),
                                       self.spm)
        print(f"{name} data: {n_docs} documents, {ntok} tokens", flush=True)
        return self._base_train(j, ckpt, iters, self.path(load) if load else None, finetune=True)

    def _base_train(self, j: int, ckpt: str, iters: int, load: str | None, *,
                    finetune: bool) -> dict:
        c, name = self.c, "base" if j == 0 else f"base_more{j}"
        return run.train(name, run.train_argv(
            c, self.spm, self.work, seq=self.L0, target=2 * self.L0, pi=1.0, mb=c["base_mb"],
            gbs=2 * c["base_mb"], iters=iters, lr=c["base_lr"],
            data_prefix=self.path(f"{name}_plain"), save=self.path(ckpt), load=load,
            seed=1234 + j, replay=True, save_interval=min(iters, BASE_SAVE_EVERY),
            finetune=finetune), self.work)

    def ft_data(self) -> None:
        """The fine-tuning documents (each ``L - 1`` tokens, fact early, recall at the end),
        their plain prefix for (b), and held-out PPL documents (``fact`` kind,
        a little over ``L`` tokens)."""
        c, count = self.c, data.token_counter(self.spm)
        n = int(c["ft_iters"] * c["ft_docs"] * 1.15) + 24
        lo = c["ft_min"] or self.P
        data.write_docs(self.path("ft.jsonl"), num_docs=n, min_tokens=lo,
                        max_tokens=self.L - 1, seed=12, count=count, fact_span=c["fact_span"])
        data.write_plain_prefix(self.path("ft.jsonl"), self.path("ft_plain"), self.spm,
                                pad_to=self.L)
        data.write_docs(self.path("ppl.jsonl"), num_docs=c["ppl_docs"], min_tokens=self.L + 64,
                        max_tokens=self.L + 64, seed=13, count=count, fact_span=None,
                        kinds=("fact",), probs=(1.0,))
        print(f"fine-tuning data: {n} documents of {lo}..{self.L - 1} tokens (+EOD)", flush=True)
        wanted = list(METHODS) if c.get("check_all") else c["methods"].split(",")
        if {"a1", "hd"} & set(wanted):  # the same documents as one stream (Megatron's packing)
            data.write_plain_prefix(self.path("ft.jsonl"), self.path("ft_stream"), self.spm)
        if {"g1p", "g1n", "g1nP", "hg"} & set(wanted):
            controls.write_short_docs(self.path("g1.jsonl"), c, count, 3 * n)
            data.write_plain_prefix(self.path("g1.jsonl"), self.path("g1_plain"), self.spm)

    def export_eval(self, ckpt: str, tag: str, *, target: int | None,
                    pi: float | None, cache: bool = False) -> dict:
        """Export ``ckpt`` and evaluate it. ``cache`` (the untrained rows: base, (a)): with
        ``--resume``, reuse an earlier evaluation of the same base, window and protocol."""
        if cache:
            sig = {"base": {k: self.c[k] for k in (*BASE_KEYS, "base_more")},
                   "eval": {k: self.c[k] for k in EVAL_KEYS}, "target": target, "pi": pi}
            done = self.path(f"evaluated_{tag}.json")
            if (entry := self.reuse(done, sig, tag)) is not None:
                return entry["eval"]
        hf = self.path(f"hf_{tag}")
        run.convert(ckpt, hf, target=target, pi=pi)
        out = run.evaluate(hf, self.path(f"eval_{tag}"), self.c, self.path("ppl.jsonl"))
        if cache:
            with open(done, "w", encoding="utf-8") as f:
                json.dump({"sig": sig, "eval": out}, f)
        return out

    def method(self, m: str, seed: int, *, terminal: int | None = None, w: float | None = None,
               s: int | None = None, tag: str | None = None) -> dict:
        """Fine-tune (b)-(g) from the base with one seed, export and evaluate."""
        c = self.c
        terminal, w, s = terminal or c["terminal"], c["w"] if w is None else w, s or c["ratio"]
        tag = tag or f"{m}_seed{seed}"
        done = self.path(f"run_{tag}.json")
        # which other methods this invocation runs does not change this one's run
        sig = {"c": {k: v for k, v in c.items() if k != "methods"}, "m": m, "seed": seed,
               "terminal": terminal, "w": w, "s": s}
        if ROWS[m].layout == tuple(pose.POSE_FLAGS):  # not the old two-piece (e): PoSE's law
            sig["law"] = pose.LAW
        if (entry := self.reuse(done, sig, tag)) is not None:
            return entry
        t0 = time.time()
        ckpt = self.path(f"ckpt_{tag}")
        shutil.rmtree(ckpt, ignore_errors=True)
        ft_seed = 1000 + seed
        # equal-tokens rows: the tokens per step of the rows that train on P tokens
        docs = ROWS[m].sequences_per_step(c["ft_docs"], P=self.P, L=self.L)
        kw = layouts.build(self, m, tag, seed, terminal=terminal, w=w)
        print("  layout " + layouts.check(m, kw, c, terminal=terminal, w=w), flush=True)
        entry = {"name": METHODS[m], "sig": sig, "seed": seed,
                 "tokens_per_step": docs * kw["seq"],
                 "samples_per_step": docs, "steps": c["ft_iters"]}
        entry["tokens_trained"] = entry["tokens_per_step"] * c["ft_iters"]
        entry.update(run.train(tag, run.train_argv(
            c, self.spm, self.work, pi=float(s), gbs=docs, iters=c["ft_iters"],
            lr=c["ft_lr"], save=ckpt, load=self.base_ckpt, seed=ft_seed,
            warmup=c["ft_warmup"], **kw),
            self.work))
        entry.update(self.export_eval(ckpt, tag, target=self.L, pi=float(s)))
        entry["wall_s"] = round(time.time() - t0, 1)
        with open(done, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        shutil.rmtree(ckpt, ignore_errors=True)  # keep the disk small; the HF export stays
        return entry


def best_placement(summary: dict, L: int) -> str:
    """(c) or (d), whichever retrieves more at ``L`` (mean of both tasks)."""
    def score(m: str) -> float:
        s = summary.get(m, {})
        vals = [s[t][str(L)]["mean"] for t in run.EVAL_TASKS if str(L) in s.get(t, {})]
        return sum(vals) / len(vals) if vals else -1.0
    return max(("c", "d"), key=score)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rerender:  # a committed JSON under today's PAIRS; no run
        with open(args.rerender, encoding="utf-8") as f:
            results = json.load(f)
        for m, e in results["methods"].items():  # today's labels (reconstructions marked)
            e["name"] = METHODS.get(m, e["name"])
        summarize(results, results["config"])
        print("wrote " + ", ".join(write(results, args.rerender, partial=False)))
        return 0
    if args.length_grid:  # one invocation per L; the base is shared through the work directory
        argv = list(sys.argv[1:] if argv is None else argv)
        i = argv.index("--length-grid")
        rest = argv[:i] + argv[i + 2:]
        stem = os.path.splitext(args.out or os.path.join(
            OUT, "mini_replication" + ("_smoke" if args.smoke else "")))[0]
        for L in (int(x) for x in args.length_grid.split(",")):
            main([*rest, "--target-length", str(L), "--lengths", f"{L // 2},{L}",
                  "--out", f"{stem}_L{L}.json"])
        return 0
    c = dict(SIZES["smoke" if args.smoke else "full"])
    c.update({k: v for k, v in vars(args).items() if k in c and v is not None})
    c["ratio"] = c["ratio"] or -(-c["L"] // c["L0"])  # s = ceil(L / L0)
    methods = [m for m in c["methods"].split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise SystemExit(f"error: --methods: unknown {bad}; choose from {','.join(METHODS)}")
    if args.seeds < 1:
        raise SystemExit("error: --seeds must be >= 1")
    if args.sweep and not {"c", "d"} & set(methods):
        raise SystemExit("error: --sweep varies the best of (c) and (d): add c or d to --methods")
    if not c["L0"] < c["L"] or not c["P"] < c["L"]:
        raise SystemExit(f"error: --target-length {c['L']} must exceed L0 = {c['L0']} and "
                         f"--seq-length {c['P']}")
    if c["fact_span"] > c["P"] - c["terminal"]:
        raise SystemExit(f"error: --fact-span {c['fact_span']} must be <= --seq-length - "
                         f"--terminal-length = {c['P'] - c['terminal']}: EndPrompt keeps a "
                         "document's first P - b tokens, which must hold the fact")
    suffix = "_smoke" if args.smoke else ""
    work = os.path.abspath(args.workdir or os.path.join(OUT, f"mini_replication_work{suffix}"))
    out_json = os.path.abspath(args.out or os.path.join(OUT, f"mini_replication{suffix}.json"))
    os.makedirs(work, exist_ok=True)
    os.makedirs(os.path.dirname(out_json), exist_ok=True)
    from megatron_endprompt import runtime

    runtime.quiet()
    t_all = time.time()
    rep = Replication(c, work, args.resume)
    timings: dict[str, float] = {}
    results: dict = {"command": "python -m benchmarks.replication.mini_replication " + " ".join(
        argv if argv is not None else sys.argv[1:]),
        "config": {**c, "seeds": args.seeds, "methods": methods},
        "methods": {}}
    t0 = time.time()
    results["base"] = {"train": rep.base()}
    timings["base_s"] = time.time() - t0
    rep.ft_data()
    if c.get("check_all"):  # --smoke: every method's data has its layout (one is trained)
        t0 = time.time()
        results["layouts"] = {m: layouts.check(m, layouts.build(
            rep, m, f"check_{m}", 0, terminal=c["terminal"], w=c["w"]), c,
            terminal=c["terminal"], w=c["w"]) for m in METHODS if ROWS[m].trains}
        print("\n".join(f"  layout {v}" for v in results["layouts"].values()), flush=True)
        timings["layouts_s"] = time.time() - t0
    t0 = time.time()
    results["base"]["eval"] = rep.export_eval(rep.base_ckpt, "base_s1", target=None,
                                              pi=None, cache=True)
    for m in [k for k in methods if not ROWS[k].trains]:  # PI only: the base under PI s
        ev = rep.export_eval(rep.base_ckpt, m, target=rep.L, pi=float(c["ratio"]),
                             cache=True)
        results["methods"][m] = {"name": METHODS[m], "tokens_trained": 0,
                                 "seeds": {"-": ev}}
    timings["base_eval_s"] = time.time() - t0
    results["data"] = data_stats.collect(rep, methods)
    for seed in range(args.seeds):
        t0 = time.time()
        for m in methods:
            if ROWS[m].trains:
                results["methods"].setdefault(m, {"name": METHODS[m], "seeds": {}})
                results["methods"][m]["seeds"][str(seed)] = rep.method(m, seed)
        timings[f"seed{seed}_s"] = time.time() - t0
        print(f"seed {seed}: {timings[f'seed{seed}_s'] / 60:.1f} min", flush=True)
        if seed + 1 < args.seeds:  # a lost machine costs the seeds not yet run, not the block
            results["seeds_done"] = seed + 1
            summarize(results, c)
            results["timings_s"] = {k: round(v, 1) for k, v in timings.items()}
            write(results, out_json, partial=True)
    results.pop("seeds_done", None)
    summarize(results, c)
    tasks = [*run.EVAL_TASKS, *(t for t in run.HELD_OUT_TASKS if t in c["held_out"].split(","))]
    if args.sweep:
        t0 = time.time()
        place = best_placement(results["summary"], rep.L)
        results["sweep"] = sweep.run_sweep(rep.method, c, results["methods"][place]["seeds"],
                                           place, args.seeds, tasks)
        timings["sweep_s"] = time.time() - t0
    timings["total_s"] = time.time() - t_all
    results["timings_s"] = {k: round(v, 1) for k, v in timings.items()}
    written = write(results, out_json, partial=False)
    print("\n" + open(written[1], encoding="utf-8").read())
    print("wrote " + ", ".join(written))
    return 0


def summarize(results: dict, c: dict) -> None:
    """Per-method summaries and the paired differences of ``PAIRS`` (both rows present)."""
    held = (c.get("held_out") or "").split(",")  # archived blocks predate held-out tasks
    tasks = [*run.EVAL_TASKS, *(t for t in run.HELD_OUT_TASKS if t in held)]
    results["summary"] = {m: stats.summarize(e["seeds"], tasks)
                          for m, e in results["methods"].items()}
    results["summary"]["base"] = stats.summarize({"-": results["base"]["eval"]}, tasks)
    seeds = {m: e["seeds"] for m, e in results["methods"].items()}
    results["paired"] = {f"{x}-{y}": {t: {n: stats.paired_difference(seeds[x], seeds[y], t, n)
                                          for n in c["lengths"].split(",")} for t in tasks}
                         for x, y in PAIRS if x in seeds and y in seeds}
    # one family per difference table: the main table's pairs, and the sweep's variants
    stats.holm_family([d for by_t in results["paired"].values() for by_n in by_t.values()
                       for d in by_n.values() if d])
    if "sweep" in results:
        for r in results["sweep"]["runs"].values():
            if "seeds" in r:  # an archived one-seed sweep stored its summary alone
                r["summary"] = stats.summarize(r["seeds"], tasks)
        stats.refresh_family([d for r in results["sweep"]["runs"].values()
                              for by_n in r.get("paired", {}).values()
                              for d in by_n.values() if d])


def write(results: dict, out_json: str, *, partial: bool) -> list[str]:
    """The JSON, its tables and figure; ``partial``: after a seed of several, beside the final
    names (``*_partial.json``), so a finished block is never overwritten by a partial one."""
    if partial:
        out_json = os.path.splitext(out_json)[0] + "_partial.json"
    with atomic_path(out_json, fsync=False) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    written = [out_json, *report.write_all(results, out_json)]
    if partial:
        print(f"seeds 0..{results['seeds_done'] - 1} written: {out_json}", flush=True)
    return written


if __name__ == "__main__":
    sys.exit(main())
