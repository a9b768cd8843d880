"""EndPrompt with LoRA against full EndPrompt in the extension protocol, at equal tokens and
steps, both trained by Megatron's ``pretrain`` (the adapters live in Megatron):

    .venv/bin/python -m benchmarks.replication.extension_lora --seeds 5 --resume \\
        --workdir WORK --out benchmarks/replication/results/extension_lora_seeds5.json

``WORK`` holds the extension protocol's cached base (``extension.py``; reused when its stamps
match ``SIZES``, else trained). Per seed, every arm (:data:`ARMS`) fine-tunes the base on the
(ep1f) row's data -- EP1 prompt terminal, fixed placement, ``P``-token samples of the natural
fine-tuning text, one sidecar per seed -- through ``run.train`` (the base's trainer): same
steps, tokens per step, LR schedule and data seed; the LoRA arms add
``--endprompt-lora-rank/-alpha/-targets`` (``B = 0``: iteration 1's loss is the full arm's,
which the tables check). Each is exported merged with PI (``run.convert``) and evaluated as
the other rows (``extension_eval``: NIAH and passkey at ``L0`` and ``L``) plus perplexity on
held-out natural text (``extension_text.write_heldout_docs``), a continuous score where the
retrieval scores sit at 0. Recorded per run: trainable parameters (the checkpoint's Adam
state), peak RSS and step time (``run.train``). Tables: ``extension_lora_report.py``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass

from benchmarks.replication import data
from benchmarks.replication import extension
from benchmarks.replication import extension_eval
from benchmarks.replication import extension_lora_report as report
from benchmarks.replication import extension_text
from benchmarks.replication import run
from megatron_endprompt.checkpoint_dir import resolve_checkpoint_dir


@dataclass(kw_only=True, frozen=True)
class Arm:
    """One fine-tuning of the block: the (ep1f) row's data and flags, full or with LoRA."""

    key: str
    """Short name in tables and paired differences."""
    label: str
    """What the arm is, as the tables print it."""
    lora: bool = False
    """Train adapters (``--endprompt-lora-*`` from the configuration), the base frozen."""
    lr_scale: float = 1.0
    """The arm's LR over ``ft_lr`` (warm-up, cosine and ``min_lr = LR / 10`` alike)."""


ARMS = {a.key: a for a in (
    Arm(key="full", label="EndPrompt (ep1f), full fine-tuning"),
    Arm(key="lora", label="EndPrompt (ep1f), LoRA, equal LR", lora=True),
    Arm(key="lora_hilr", label="EndPrompt (ep1f), LoRA, 10x LR", lora=True, lr_scale=10.0),
)}
#: LoRA arm - full arm, paired by seed; one Holm family.
PAIRS = (("lora", "full"), ("lora_hilr", "full"))
ROW = extension.ROWS["ep1f"]
_BLOCK = dict(lora_rank=8, lora_alpha=16.0,
              lora_targets=["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
              ft_log_interval=1, ppl_docs=24, ppl_doc_tokens=1024, ppl_stride=256,
              arms=",".join(ARMS))
SIZES = {
    "full": {**{k: v for k, v in extension.SIZES.items() if k != "rows"}, **_BLOCK},
    # CI form: a 2-step base, two arms of 2 steps, 2 prompts per cell (3 torchrun launches)
    "smoke": {**{k: v for k, v in extension.SIZES.items() if k != "rows"}, **_BLOCK,
              **dict(hidden=32, ffn=64, layers=2, heads=2, groups=1, base_iters=2, base_mb=2,
                     base_more=[], ft_iters=2, ft_docs=2, ft_warmup=1, samples=2,
                     eval_batch=4, ppl_docs=2, arms="full,lora")},
}


def checkpoint_params(save_dir: str) -> dict:
    """Parameter counts of the last checkpoint under ``save_dir`` (``torch_dist`` metadata):
    ``trainable`` = elements of Adam's first moment (the optimizer keeps state for trainable
    parameters only), ``adapters`` = elements of the ``.lora_a`` / ``.lora_b`` tensors, ``base``
    = elements of every other model tensor."""
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(resolve_checkpoint_dir(save_dir)).read_metadata()
    sizes = {k: math.prod(v.size) for k, v in meta.state_dict_metadata.items()
             if getattr(v, "size", None) is not None}
    out = {"trainable": 0, "adapters": 0, "base": 0}
    for k, n in sizes.items():
        if k.startswith("optimizer.state.exp_avg."):
            out["trainable"] += n
        elif not k.startswith("optimizer."):
            out["adapters" if k.endswith((".lora_a", ".lora_b")) else "base"] += n
    return out


def lora_flags(c: dict) -> list[str]:
    """``pretrain``'s adapter flags of the configuration (dropout 0: no extra randomness)."""
    return ["--endprompt-lora-rank", str(c["lora_rank"]), "--endprompt-lora-alpha",
            f"{c['lora_alpha']:g}", "--endprompt-lora-dropout", "0",
            "--endprompt-lora-targets", *c["lora_targets"]]


class LoraBlock:
    """The arms of one invocation on an :class:`~benchmarks.replication.extension.Extension`
    (its base, documents, exports, prompts and ``--resume`` cache)."""

    def __init__(self, ext: extension.Extension):
        self.ext, self.c, self._data = ext, ext.c, set()

    def heldout(self) -> dict:
        """The held-out documents (after ``ext.ft_data()`` wrote the fine-tuning text)."""
        ext = self.ext
        return extension_text.write_heldout_docs(
            ext.path("heldout.jsonl"), corpus=ext.corpus, fine_tuning=ext.path("natural.jsonl"),
            num_docs=self.c["ppl_docs"], min_tokens=self.c["ppl_doc_tokens"],
            count=data.token_counter(ext.spm))

    def ppl(self, model) -> dict:
        c = self.c
        return extension_eval.heldout_ppl(model, self.ext.tok, self.ext.path("heldout.jsonl"),
                                          lengths=(self.ext.L0, self.ext.L),
                                          stride=c["ppl_stride"], doc_tokens=c["ppl_doc_tokens"])

    def reference(self, tag: str) -> dict:
        """An untrained export (``base_s1``, ``base_pi``): its retrieval (the protocol's own
        cached evaluation) and its held-out PPL."""
        ext, c = self.ext, self.c
        entry = dict(ext.untrained(tag))
        sig = {"base": {k: c[k] for k in (*extension.BASE_KEYS, *extension.MORE_KEYS)},
               "L": ext.L, **{k: c[k] for k in ("ppl_docs", "ppl_doc_tokens", "ppl_stride")}}
        entry["ppl"] = ext.cached(f"ppl_{tag}", sig, lambda: {"ppl": self.ppl(
            ext.load_model(tag))})["ppl"]
        return entry

    def arm(self, a: Arm, seed: int) -> dict:
        sig = {"c": {k: v for k, v in self.c.items() if k != "arms"}, "arm": repr(a),
               "row": repr(ROW), "seed": seed}
        return self.ext.cached(f"lora_{a.key}_seed{seed}", sig, lambda: self._arm(a, seed))

    def _arm(self, a: Arm, seed: int) -> dict:
        ext, c, t0 = self.ext, self.c, time.time()
        tag = f"lora_{a.key}_seed{seed}"
        prefix = ext.path(f"ft_mg_ep1f_seed{seed}")
        if seed not in self._data:  # one sidecar per seed, every arm reads it
            ext.preprocess(ROW, prefix, seed)
            self._data.add(seed)
        ckpt, lr = ext.path(f"ckpt_{tag}"), c["ft_lr"] * a.lr_scale
        shutil.rmtree(ckpt, ignore_errors=True)
        argv = run.train_argv(
            {**c, "log_interval": c["ft_log_interval"]}, ext.spm, ext.work, seq=ext.P,
            target=ext.L, pi=float(ext.s), mb=c["ft_docs"], gbs=c["ft_docs"],
            iters=c["ft_iters"], lr=lr, data_prefix=prefix, save=ckpt, load=ext.base_ckpt,
            seed=1000 + seed, warmup=c["ft_warmup"])
        entry = {"tokens_per_step": c["ft_docs"] * ext.P, "sequences_per_step": c["ft_docs"],
                 "steps": c["ft_iters"], "lr": lr}
        entry.update(run.train(tag, argv + (lora_flags(c) if a.lora else []), ext.work,
                               nproc=c["nproc"]))
        entry["params"] = checkpoint_params(ckpt)
        run.convert(ckpt, ext.path(f"hf_{tag}"), target=ext.L, pi=float(ext.s))
        shutil.rmtree(ckpt, ignore_errors=True)  # the merged HF export stays
        model = ext.load_model(tag)
        entry.update(ext.evaluate(model, tag))
        entry["ppl"] = self.ppl(model)
        print(f"[{tag}] trainable {entry['params']['trainable']:,}, held-out PPL "
              + ", ".join(f"@{n} {v['ppl']:.3f}" for n, v in entry["ppl"].items()), flush=True)
        entry["wall_s"] = round(time.time() - t0, 1)
        return entry


def summarize(results: dict) -> None:
    """The block's statistics over :data:`PAIRS`, in place (``report.summarize``)."""
    report.summarize(results, PAIRS)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="LoRA against full EndPrompt in the extension "
                                            "protocol (Megatron's pretrain for both).")
    p.add_argument("--smoke", action="store_true", help="CI form: tiny model, 2 steps")
    p.add_argument("--seeds", type=int, default=5, help="fine-tuning seeds (default 5)")
    p.add_argument("--workdir", default=None, help="work directory (the base is cached there)")
    p.add_argument("--out", default=None, help="results JSON (.md beside it)")
    p.add_argument("--resume", action="store_true", help="reuse finished runs in --workdir")
    p.add_argument("--corpus", default=extension.CORPUS, help="tinyshakespeare.txt")
    p.add_argument("--rerender", default=None, metavar="RESULTS.json",
                   help="recompute the statistics of a results JSON and rewrite its tables")
    for flag, key, typ in (("--arms", "arms", str), ("--ft-iters", "ft_iters", int),
                           ("--lora-rank", "lora_rank", int),
                           ("--lora-alpha", "lora_alpha", float),
                           ("--ppl-docs", "ppl_docs", int)):
        p.add_argument(flag, dest=key, type=typ, default=None, help=f"override {key}")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rerender:
        return extension.rerender(args.rerender, summarize, report.write_md)
    c = dict(SIZES["smoke" if args.smoke else "full"])
    c.update({k: v for k, v in vars(args).items() if k in c and v is not None})
    arms = [k for k in c["arms"].split(",") if k]
    bad = [k for k in arms if k not in ARMS]
    if bad or not arms:
        raise SystemExit(f"error: --arms: unknown {bad or 'none given'}; choose from "
                         f"{','.join(ARMS)}")
    if args.seeds < 1:
        raise SystemExit("error: --seeds must be >= 1")
    if not os.path.isfile(args.corpus):
        raise SystemExit(f"error: --corpus {args.corpus}: no such file; give the shared "
                         "corpus' tinyshakespeare.txt")
    name = "extension_lora" + ("_smoke" if args.smoke else "")
    work = os.path.abspath(args.workdir or os.path.join("benchmarks", "out", name + "_work"))
    out_json = os.path.abspath(args.out or os.path.join("benchmarks", "out", name + ".json"))
    os.makedirs(work, exist_ok=True)
    os.makedirs(os.path.dirname(out_json), exist_ok=True)
    from megatron_endprompt import runtime  # lazy: spares torch

    runtime.quiet()
    import torch  # the evaluation runs in this process

    torch.set_num_threads(c["threads"])
    t_all = time.time()
    ext = extension.Extension(c, work, args.resume, os.path.abspath(args.corpus))
    block = LoraBlock(ext)
    results: dict = {"command": "python -m benchmarks.replication.extension_lora " + " ".join(
        argv if argv is not None else sys.argv[1:]), "config": {**c, "seeds": args.seeds},
        "arms": {}}
    results["base"] = {"train": ext.base(), "stage2": ext.base_more()}
    results["ft_data"] = ext.ft_data()
    results["heldout"] = block.heldout()
    ext.exports()
    results["fill"] = ext.fill
    results["references"] = {t: block.reference(t) for t in ("base_s1", "base_pi")}
    for k in arms:
        results["arms"][k] = {"label": ARMS[k].label, "seeds": {}}
    timings: dict[str, float] = {}
    for seed in range(args.seeds):
        t0 = time.time()
        order = arms[seed % len(arms):] + arms[:seed % len(arms)]  # drift hits every arm
        for k in order:  # each arm's seeds stay in seed order: one seed per pass
            results["arms"][k]["seeds"][str(seed)] = block.arm(ARMS[k], seed)
        extension.seed_done(results, timings, seed=seed, t0=t0, t_all=t_all,
                            out_json=out_json, summarize=summarize, write_md=report.write_md)
    print("\n" + open(os.path.splitext(out_json)[0] + ".md", encoding="utf-8").read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
