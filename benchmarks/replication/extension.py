"""The extension protocol: does a method keep, at ``L``, a retrieval skill the base has only
inside its window ``L0``?

    .venv/bin/python -m benchmarks.replication.extension --seeds 15 --resume \\
        --workdir /work/repl46 --out benchmarks/replication/results/extension_seeds15.json

* **Base** (cached in ``--workdir``): pretrained at ``L0`` (``s = 1``) on a mix of natural text
  and retrieval templates in wordings the evaluator never uses (``extension_text.py``).
* **Extension fine-tuning** (every trained row, the same steps and tokens per step): natural
  text only -- the corpus' held-out speeches and generated prose; no template, no question,
  no answer -- under PI ``s = L / L0``.
* **Evaluation** (``extension_eval.py``): every row at ``L0`` and at ``L`` on the evaluator's
  templates (RULER ``niah_single_1``, landmark passkey), each prompt filling its length
  within 2%; the same prompts for every row and seed.
* **Statistic**: ``retention`` = score(L) - score(L0) per seed; methods are compared by the
  paired difference of retentions (Student-t 95% interval, paired t-test, Holm over the
  table), with score(L0) beside it (what PI and the fine-tuning cost inside the window).

Rows (:data:`ROWS`, one :class:`~benchmarks.replication.rows.RowSpec` each): PI only; EndPrompt
with the EP1 prompt terminal, fixed and random placement; a continuation terminal; full-length
fine-tuning at equal tokens on the same text; PoSE; ET(PoSE) (our reconstruction: the official
EndPrompt code has no ET(PoSE) path) with the single-factor pair ET(PoSE) - ET at the same
prompt terminal and ``w``. Tables: ``extension_report.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

from benchmarks.replication import extension_eval
from benchmarks.replication import extension_report
from benchmarks.replication import extension_text
from benchmarks.replication import extension_train
from benchmarks.replication import data
from benchmarks.replication import pose
from benchmarks.replication import run
from benchmarks.replication.rows import RowSpec
from megatron_endprompt.disk import atomic_path

#: The shared corpus beside the project's checkout (``--corpus`` names another).
CORPUS = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared",
                                       "corpus", "tinyshakespeare.txt"))

_PROMPT = ("--terminal-source", "prompt", "--terminal-prompts", "ep1",
           "--terminal-loss-weight", "{pw}")
ROWS = {r.key: r for r in (
    RowSpec(key="pi", label="PI only (no training)"),
    RowSpec(key="ep1f", label="EndPrompt, EP1 prompt terminal, fixed", source="natural.jsonl",
            layout=("--placement", "fixed", *_PROMPT)),
    RowSpec(key="ep1r", label="EndPrompt, EP1 prompt terminal, random", source="natural.jsonl",
            layout=("--placement", "random", *_PROMPT)),
    RowSpec(key="cont", label="EndPrompt, continuation terminal (b tokens), fixed",
            source="natural.jsonl",
            layout=("--placement", "fixed", "--terminal-source", "continuation",
                    "--terminal-length", "{b}", "--terminal-loss-weight", "{pw}")),
    RowSpec(key="full", label="full-length FT at L, equal tokens, same text",
            source="natural_stream", plain="packed", seq="L", equal_tokens=True),
    RowSpec(key="pose", label="PoSE (train_pose.py law)", source="natural.jsonl",
            layout=tuple(pose.POSE_FLAGS)),
    RowSpec(key="etpose", label="ET(PoSE): PoSE's law + EP1 terminal (reconstruction)",
            source="natural.jsonl", layout=("--placement", "pose", *_PROMPT),
            reconstruction=True),
)}

#: Paired differences of retention (x - y), one Holm family; the last is the single-factor
#: pair (same EP1 terminal at L - b, same w: only PoSE's context law differs).
PAIRS = (("ep1f", "full"), ("ep1r", "full"), ("cont", "full"), ("pose", "full"),
         ("etpose", "full"), ("full", "pi"), ("ep1f", "pi"), ("ep1r", "ep1f"),
         ("cont", "ep1f"), ("etpose", "pose"), ("etpose", "ep1f"))

#: Sized for ~1 CPU core: a seed of every row in a few minutes.
SIZES = dict(hidden=96, ffn=256, layers=3, heads=4, groups=2, vocab=1024, split_digits=True,
             L0=256, L=512, P=128, base_iters=1500, base_mb=16, base_lr=3e-3,
             base_more=[900, 1200], base_more_docs=6000, ft_iters=50,
             ft_docs=8, ft_lr=1e-3, ft_warmup=8, terminal=16, prompt_w=0.1, samples=20,
             eval_batch=20, log_interval=50, nproc=1, threads=1, min_base_l0=0.2,
             rows=",".join(ROWS))
BASE_KEYS = ("hidden", "ffn", "layers", "heads", "groups", "vocab", "split_digits", "L0",
             "base_iters", "base_mb", "base_lr")
MORE_KEYS = ("base_more", "base_more_docs")


class Extension:
    """The runs of one invocation, sharing a work directory, a base and the documents."""

    def __init__(self, c: dict, work: str, resume: bool, corpus: str):
        self.c, self.work, self.resume, self.corpus = c, work, resume, corpus
        self.L0, self.L, self.P = c["L0"], c["L"], c["P"]
        self.s = c["L"] // c["L0"]
        self.spm = self.path("tokenizer.model")
        self.plan = extension_eval.EvalPlan(lengths=(self.L0, self.L), samples=c["samples"],
                                            batch=c["eval_batch"])
        self.samples = None

    def path(self, *p: str) -> str:
        return os.path.join(self.work, *p)

    def _train(self, name: str, **kw) -> dict:
        c = self.c
        return run.train(name, run.train_argv(c, self.spm, self.work, **kw), self.work,
                         nproc=c["nproc"])

    def base(self) -> dict:
        """Tokenizer, base documents and base checkpoint, cached under their configuration."""
        c, stamp = self.c, self.path("base_stamp.json")
        key = {k: c[k] for k in BASE_KEYS}
        self.base_ckpt = self.path("ckpt_base")
        if os.path.exists(stamp):
            with open(stamp, encoding="utf-8") as f:
                cached = json.load(f)
            if cached["key"] == key:
                print(f"base: reusing {self.base_ckpt}", flush=True)
                return cached["train"]
        corpus = extension_text.write_tokenizer_corpus(self.path("tokenizer_corpus.jsonl"),
                                                       corpus=self.corpus, num_docs=600)
        from megatron_endprompt.data.prepare import synthetic

        synthetic.train_sentencepiece(corpus, self.path("tokenizer"), vocab_size=c["vocab"],
                                      split_digits=c["split_digits"])
        count = data.token_counter(self.spm)
        lo = max(64, self.L0 // 4)
        n = int(c["base_iters"] * c["base_mb"] * self.L0 * 1.1 / ((lo + self.L0) / 2)) + 60
        kinds = extension_text.write_base_docs(self.path("base.jsonl"), corpus=self.corpus,
                                               num_docs=n, min_tokens=lo, max_tokens=self.L0,
                                               seed=11, count=count)
        ntok = data.write_plain_prefix(self.path("base.jsonl"), self.path("base_plain"),
                                       self.spm)
        print(f"base data: {kinds}, {ntok} tokens", flush=True)
        shutil.rmtree(self.base_ckpt, ignore_errors=True)
        train = self._train("base", seq=self.L0, target=2 * self.L0, pi=1.0, mb=c["base_mb"],
                            gbs=c["base_mb"], iters=c["base_iters"], lr=c["base_lr"],
                            data_prefix=self.path("base_plain"), save=self.base_ckpt,
                            load=None, seed=1234, replay=True)
        train["documents"] = kinds
        with open(stamp, "w", encoding="utf-8") as f:
            json.dump({"key": key, "train": train}, f)
        return train

    def base_more(self) -> list[dict]:
        """Further pretraining stages from the base (``base_more``: steps per stage; each
        ``--finetune`` from the previous, fresh schedule) on one template-heavy mix
        (``BASE_MORE_PROBS``) of ``base_more_docs`` new documents, each cached like the base."""
        c, trains = self.c, []
        prefix = self.path("base_more_plain")
        for j, iters in enumerate(c["base_more"], 1):
            key = {**{k: c[k] for k in BASE_KEYS}, "base_more": c["base_more"][:j],
                   "base_more_docs": c["base_more_docs"]}
            stamp, ckpt = self.path(f"base_more{j}_stamp.json"), self.path(f"ckpt_base_more{j}")
            if os.path.exists(stamp):
                with open(stamp, encoding="utf-8") as f:
                    cached = json.load(f)
                if cached["key"] == key:
                    print(f"base stage {j + 1}: reusing {ckpt}", flush=True)
                    self.base_ckpt = ckpt
                    trains.append(cached["train"])
                    continue
            if not os.path.exists(prefix + ".idx"):  # the same documents for every stage
                count = data.token_counter(self.spm)
                kinds = extension_text.write_base_docs(
                    self.path("base_more.jsonl"), corpus=self.corpus,
                    num_docs=c["base_more_docs"], min_tokens=max(64, self.L0 // 4),
                    max_tokens=self.L0, seed=21, count=count,
                    probs=extension_text.BASE_MORE_PROBS)
                data.write_plain_prefix(self.path("base_more.jsonl"), prefix, self.spm)
                print(f"base stages 2+ data: {kinds}", flush=True)
            shutil.rmtree(ckpt, ignore_errors=True)
            train = self._train(f"base_more{j}", seq=self.L0, target=2 * self.L0, pi=1.0,
                                mb=c["base_mb"], gbs=c["base_mb"], iters=iters,
                                lr=c["base_lr"], data_prefix=prefix, save=ckpt,
                                load=self.base_ckpt, seed=1234 + j, replay=True)
            self.base_ckpt = ckpt
            with open(stamp, "w", encoding="utf-8") as f:
                json.dump({"key": key, "train": train}, f)
            trains.append(train)
        return trains

    def ft_data(self) -> dict:
        """The fine-tuning documents (``P .. L - 1`` tokens) and their packed stream."""
        c, count = self.c, data.token_counter(self.spm)
        n = int(c["ft_iters"] * c["ft_docs"] * 1.15) + 24
        kinds = extension_text.write_natural_docs(self.path("natural.jsonl"), corpus=self.corpus,
                                                  num_docs=n, min_tokens=self.P,
                                                  max_tokens=self.L - 1, seed=12, count=count)
        ntok = data.write_plain_prefix(self.path("natural.jsonl"),
                                       self.path("natural_stream"), self.spm)
        print(f"fine-tuning text: {kinds}, {ntok} tokens", flush=True)
        return {"documents": kinds, "tokens": ntok}

    def exports(self) -> None:
        """The base exported twice: its own window (``s = 1``) and with PI ``s`` (the PI-only
        row and every fine-tuning's start); the prompts built once (one tokenizer)."""
        from megatron_endprompt.evaluation.core.prompt import TextTokens

        for tag, target in (("base_s1", None), ("base_pi", self.L)):
            run.convert(self.base_ckpt, self.path(f"hf_{tag}"), target=target,
                        pi=float(self.s) if target else None)
        self.tok = extension_eval.runner.load_tokenizer(self.path("hf_base_pi"))
        self.samples = extension_eval.build_samples(TextTokens(self.tok), self.plan)
        self.fill = extension_eval.fill_stats(self.samples)

    def load_model(self, tag: str):
        return extension_eval.runner.load_model(self.path(f"hf_{tag}"), device="cpu",
                                                dtype="float32")

    def evaluate(self, model, tag: str) -> dict:
        out = extension_eval.evaluate(model, self.tok, self.samples, self.plan)
        print(f"  eval {tag}: " + " ".join(f"{t}@{n}={k:.0f}/{m}" for t, d in
                                           out["counts"].items() for n, (k, m) in d.items())
              + f" ({out['eval_s']:.0f} s)", flush=True)
        return out

    def cached(self, tag: str, sig: dict, make) -> dict:
        """``make()``'s entry, stored as ``run_{tag}.json`` and reused under ``--resume``
        when made under the same ``sig``."""
        done = self.path(f"run_{tag}.json")
        if self.resume and os.path.exists(done):
            with open(done, encoding="utf-8") as f:
                entry = json.load(f)
            if entry.get("sig") == sig:
                print(f"[{tag}] reusing {done}", flush=True)
                return entry
        entry = {"sig": sig, **make()}
        with open(done, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        return entry

    def untrained(self, tag: str) -> dict:
        """The base at ``s = 1`` (``base_s1``) or with PI (``base_pi``), evaluated."""
        sig = {"base": {k: self.c[k] for k in (*BASE_KEYS, *MORE_KEYS)}, "L": self.L,
               "P": self.P, "samples": self.c["samples"]}
        return self.cached(tag, sig, lambda: self.evaluate(self.load_model(tag), tag))

    def row(self, r: RowSpec, seed: int) -> dict:
        """Fine-tune row ``r`` from the base with one seed and evaluate it."""
        sig = {"c": {k: v for k, v in self.c.items() if k != "rows"}, "row": repr(r),
               "seed": seed}
        return self.cached(f"{r.key}_seed{seed}", sig, lambda: self._row(r, seed))

    def _row(self, r: RowSpec, seed: int) -> dict:
        c, tag, t0 = self.c, f"{r.key}_seed{seed}", time.time()
        per_step = r.sequences_per_step(c["ft_docs"], P=self.P, L=self.L)
        if r.plain:
            seq = self.L
            batches = extension_train.packed_batches(self.path(r.source), length=self.L,
                                                     per_step=per_step, seed=1000 + seed)
        else:
            seq, prefix = self.P, self.path(f"ft_{tag}")
            self.preprocess(r, prefix, seed)
            batches = extension_train.sidecar_batches(prefix, per_step=per_step,
                                                      seed=1000 + seed)
        entry = {"tokens_per_step": per_step * seq, "sequences_per_step": per_step,
                 "steps": c["ft_iters"]}
        model = self.load_model("base_pi")
        entry.update(extension_train.finetune(model, batches, steps=c["ft_iters"],
                                              lr=c["ft_lr"], warmup=c["ft_warmup"],
                                              seed=1000 + seed))
        losses = list(entry["losses"].values())
        print(f"[{tag}] {entry['train_wall_s']:.0f} s, {entry['step_ms']:.0f} ms/step, loss "
              f"{losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
        entry.update(self.evaluate(model, tag))
        entry["wall_s"] = round(time.time() - t0, 1)
        return entry

    def preprocess(self, r: RowSpec, prefix: str, seed: int) -> None:
        from megatron_endprompt.cli import preprocess
        from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path

        flags = r.flags(terminal=self.c["terminal"], weight=1.0,
                        prompt_weight=self.c["prompt_w"])
        run.tool(preprocess.main, [
            "--input", self.path(r.source), "--output-prefix", prefix,
            "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", self.spm,
            "--seq-length", str(self.P), "--target-length", str(self.L), "--append-eod",
            "--workers", "1", "--no-progress", "--seed", str(1000 + seed), *flags],
            quiet=True)
        lay = read_sidecar(sidecar_path(prefix), prefix=prefix).layout  # verified as trained
        if (lay.seq_length, lay.target_length) != (self.P, self.L):
            raise SystemExit(f"error: row {r.key}: {prefix}: P, L = {lay.seq_length}, "
                             f"{lay.target_length}, not {self.P}, {self.L}")


def summarize(results: dict) -> None:
    """The protocol's statistics over :data:`PAIRS`, in place (``extension_report.summarize``)."""
    extension_report.summarize(results, PAIRS)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Extension protocol of the replication: retention "
                                            "of in-window retrieval at L after fine-tuning.")
    p.add_argument("--seeds", type=int, default=1, help="fine-tuning seeds per row")
    p.add_argument("--workdir", default=None, help="work directory (the base is cached there)")
    p.add_argument("--out", default=None, help="results JSON (.md beside it)")
    p.add_argument("--resume", action="store_true", help="reuse finished runs in --workdir")
    p.add_argument("--corpus", default=CORPUS, help="tinyshakespeare.txt (default: %(default)s)")
    p.add_argument("--rerender", default=None, metavar="RESULTS.json",
                   help="recompute the statistics of a results JSON and rewrite its tables")
    for flag, key, typ in (("--rows", "rows", str), ("--ft-iters", "ft_iters", int),
                           ("--base-iters", "base_iters", int), ("--samples", "samples", int),
                           ("--target-length", "L", int), ("--seq-length", "P", int)):
        p.add_argument(flag, dest=key, type=typ, default=None, help=f"override {key}")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rerender:
        return rerender(args.rerender, summarize, extension_report.write_md)
    c = dict(SIZES)
    c.update({k: v for k, v in vars(args).items() if k in c and v is not None})
    rows = [k for k in c["rows"].split(",") if k]
    bad = [k for k in rows if k not in ROWS]
    if bad:
        raise SystemExit(f"error: --rows: unknown {bad}; choose from {','.join(ROWS)}")
    if args.seeds < 1 or c["L"] % c["L0"] or not c["P"] < c["L0"] < c["L"]:
        raise SystemExit("error: need --seeds >= 1, P < L0 < L and L a multiple of L0")
    if not os.path.isfile(args.corpus):
        raise SystemExit(f"error: --corpus {args.corpus}: no such file; give the shared "
                         "corpus' tinyshakespeare.txt (the natural text)")
    work = os.path.abspath(args.workdir or os.path.join("benchmarks", "out", "extension_work"))
    out_json = os.path.abspath(args.out or os.path.join("benchmarks", "out", "extension.json"))
    os.makedirs(work, exist_ok=True)
    os.makedirs(os.path.dirname(out_json), exist_ok=True)
    from megatron_endprompt import runtime

    runtime.quiet()
    import torch  # the fine-tuning and evaluation run in this process

    torch.set_num_threads(c["threads"])
    t_all = time.time()
    ext = Extension(c, work, args.resume, os.path.abspath(args.corpus))
    results: dict = {"command": "python -m benchmarks.replication.extension " + " ".join(
        argv if argv is not None else sys.argv[1:]), "config": {**c, "seeds": args.seeds},
        "rows": {}}
    results["base"] = {"train": ext.base(), "stage2": ext.base_more()}
    results["ft_data"] = ext.ft_data()
    ext.exports()
    results["fill"] = ext.fill
    results["base"]["eval"] = ext.untrained("base_s1")
    base_l0 = [k / n for t, d in results["base"]["eval"]["counts"].items()
               for ln, (k, n) in d.items() if int(ln) == ext.L0]
    if max(base_l0) < c["min_base_l0"]:  # nothing to retain: the block would measure noise
        raise SystemExit(f"error: the base retrieves {max(base_l0):.0%} at most at L0 = "
                         f"{ext.L0} (< {c['min_base_l0']:.0%}); train it longer "
                         "(base_more) before extending it")
    for k in rows:
        results["rows"][k] = {"label": ROWS[k].label, "reconstruction": ROWS[k].reconstruction,
                              "seeds": {}}
    if "pi" in rows:
        results["rows"]["pi"]["seeds"]["-"] = ext.untrained("base_pi")
    timings: dict[str, float] = {}
    for seed in range(args.seeds):
        t0 = time.time()
        for k in rows:
            if ROWS[k].trains:
                results["rows"][k]["seeds"][str(seed)] = ext.row(ROWS[k], seed)
        seed_done(results, timings, seed=seed, t0=t0, t_all=t_all, out_json=out_json,
                  summarize=summarize, write_md=extension_report.write_md)
    print("\n" + open(os.path.splitext(out_json)[0] + ".md", encoding="utf-8").read())
    return 0


def seed_done(results: dict, timings: dict, *, seed: int, t0: float, t_all: float,
              out_json: str, summarize, write_md) -> None:
    """After each seed of a block: its time, ``seeds_done``, the block's statistics
    (``summarize(results)``), then the JSON and its tables (``write_md(results, out_json)``)
    rewritten, so a stopped run keeps every finished seed."""
    timings[f"seed{seed}_s"] = round(time.time() - t0, 1)
    results["seeds_done"] = seed + 1
    results["timings_s"] = {**timings, "total_s": round(time.time() - t_all, 1)}
    summarize(results)
    write_results(results, out_json, write_md)
    print(f"seed {seed}: {timings[f'seed{seed}_s'] / 60:.1f} min; wrote {out_json}", flush=True)


def rerender(path: str, summarize, write_md) -> int:
    """``--rerender RESULTS.json``: statistics and tables again from a results file."""
    with open(path, encoding="utf-8") as f:
        results = json.load(f)
    summarize(results)
    print("wrote " + ", ".join(write_results(results, path, write_md)))
    return 0


def write_results(results: dict, out_json: str, write_md) -> list[str]:
    """The JSON (rewritten after every seed: ``seeds_done`` says how many) and its tables
    (``write_md(results, out_json)`` returns their path)."""
    with atomic_path(out_json, fsync=False) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    return [out_json, write_md(results, out_json)]


if __name__ == "__main__":
    sys.exit(main())
