"""One method of the mini-replication through the product's tools: preprocessing
(``cli.preprocess``), Megatron's ``pretrain`` under torchrun (``demo_train.run_pretrain``, 2 CPU
ranks, data parallel), export (``cli.convert megatron-to-hf``) and evaluation (``cli.eval``).

Measured per training: *step time* = median of Megatron's logged "elapsed time per iteration
(ms)" (the first log interval, with start-up, dropped); *peak memory* = ``ru_maxrss`` of
``RUSAGE_CHILDREN`` in a forked process that only runs torchrun: the largest resident set of
any single process of the torchrun tree (a training rank), runtime included.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import resource
import statistics
import time

from benchmarks.replication import stats
from benchmarks.replication.protocol import ROWS

from megatron_endprompt.demo_train import TINY_LLAMA, parse_losses, run_pretrain
from megatron_endprompt.errors import run_cli

_ELAPSED = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
EVAL_TASKS = ("niah_single_1", "passkey")
#: RULER tasks no fine-tuning document contains: tables mark them held-out. (``vt``
#: does not fit: its smallest prompt + 30 generated tokens is 881 tokens here, over L = 640.)
HELD_OUT_TASKS = ("niah_multikey_2", "niah_multivalue", "niah_multiquery")
PASSKEY_DEPTHS = "0,0.25,0.5,0.75,1"


def model_flags(c: dict) -> list[str]:
    """``TINY_LLAMA`` (the demo's Llama) with this run's sizes."""
    flags = list(TINY_LLAMA)
    for flag, key in (("--hidden-size", "hidden"), ("--ffn-hidden-size", "ffn"),
                      ("--num-layers", "layers"), ("--num-attention-heads", "heads"),
                      ("--num-query-groups", "groups")):
        flags[flags.index(flag) + 1] = str(c[key])
    return flags


def _train_child(argv: list[str], log_path: str, conn, nproc: int) -> None:
    rc, _ = run_pretrain(argv, log_path=log_path, nproc=nproc)
    conn.send((rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
    conn.close()


def train(name: str, argv: list[str], work: str, *, nproc: int = 2) -> dict:
    """One ``pretrain`` run (``nproc`` data-parallel CPU ranks) in a forked process (so
    ``RUSAGE_CHILDREN`` covers only its torchrun tree); returns step time, peak RSS and losses.
    Exits on failure with the log's tail."""
    log_path = os.path.join(work, f"train_{name}.log")
    print(f"[{name}] torchrun --nproc_per_node {nproc} -m megatron_endprompt.training.pretrain ... "
          f"(log: {log_path})", flush=True)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    t0 = time.time()
    proc = ctx.Process(target=_train_child, args=(argv, log_path, child, nproc))
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
    return {"step_ms": step_ms, "peak_rss_mib": maxrss_kib / 1024, "train_wall_s": round(wall, 1),
            "losses": {str(k): v for k, v in sorted(losses.items())}}


def tool(main, argv: list[str], quiet: bool = False) -> None:
    if not quiet:
        print(f"$ {main.__module__.split('.')[-1]} {' '.join(argv)}", flush=True)
    rc = run_cli(main, argv)
    if rc:
        raise SystemExit(f"error: {main.__module__} exited {rc}")


def train_argv(c: dict, spm: str, work: str, *, seq: int, target: int, pi: float, mb: int,
               gbs: int, iters: int, lr: float, data_prefix: str, save: str,
               load: str | None, seed: int, save_interval: int | None = None,
               replay: bool = False, warmup: int | None = None,
               eod_mask: bool = False, finetune: bool = True) -> list[str]:
    """``pretrain``'s argv. ``load`` with ``finetune``: start from its weights (fresh schedule);
    without: continue that run (its iteration, schedule, optimizer and data position)."""
    warm = warmup or max(1, min(20, iters // 10))
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
        "--clip-grad", "1.0", "--seed", str(seed), "--calculate-per-token-loss",
        "--log-interval", str(c["log_interval"]), "--eval-interval", str(iters),
        "--eval-iters", "1", "--num-workers", "0", "--save", save,
        "--save-interval", str(save_interval or iters), "--ckpt-format", "torch_dist",
    ]
    if eod_mask:  # EOD-padded documents (full-length fine-tuning): the padding is not trained
        argv += ["--eod-mask-loss"]
    if load:
        argv += ["--load", load, *(["--finetune"] if finetune else [])]
    return argv


def layout_flags(method: str, *, terminal: int, w: float, prompt_w: float) -> list[str]:
    """Preprocessing flags of a sidecar row (``protocol.ROWS[method].layout`` filled)."""
    return ROWS[method].flags(terminal=terminal, weight=w, prompt_weight=prompt_w)


def convert(ckpt: str, hf: str, *, target: int | None, pi: float | None) -> None:
    """Export to HF; ``target=None``: the plain export (the checkpoint's own window, no PI)."""
    from megatron_endprompt.cli import convert as conv

    window = [] if target is None else ["--target-length", str(target), "--pi-factor",
                                        str(float(pi or 1.0))]
    tool(conv.main, ["megatron-to-hf", "--checkpoint", ckpt, "--output", hf, *window,
                     "--overwrite", "--no-progress"])


def held_out_lengths(hf: str, tasks: list[str], lengths: list[int]) -> dict[str, list[int]]:
    """Per held-out RULER task, the ``lengths`` at which its prompt with the smallest haystack
    plus its generated tokens fits (the evaluator's own check, ``ruler.check_length``, under the
    exported tokenizer). At the toy's ``L0 = 320``, ``niah_multivalue`` (321 tokens) and
    ``niah_multiquery`` (368) do not fit: such a cell is reported as not run, never as 0."""
    if not tasks:
        return {}
    from megatron_endprompt.evaluation.ruler import synthetic as ruler
    from megatron_endprompt.evaluation.ruler import sources as ruler_sources
    from megatron_endprompt.evaluation.core import runner
    from megatron_endprompt.evaluation.core.prompt import TextTokens
    from megatron_endprompt.evaluation.ruler.spec import ESSAY_TASKS

    tokens = TextTokens(runner.load_tokenizer(hf))  # as the evaluator loads them
    haystack = ruler_sources.load_haystack(None) if set(tasks) & set(ESSAY_TASKS) else None
    out: dict[str, list[int]] = {}
    for t in tasks:
        out[t] = []
        for n in lengths:
            try:
                ruler.check_length(t, tokens, length=n, seed=42, haystack=haystack)
            except ValueError:
                continue
            out[t].append(n)
    return out


def evaluate(hf: str, out_prefix: str, c: dict, ppl_data: str) -> dict:
    """RULER ``niah_single_1`` (``samples`` prompts per length) + per-document PPL, then
    landmark passkey (``samples / 5`` prompts x 5 depths per length), with the project's
    evaluator. Returns ``{"counts": {task: {length: [k, n]}}, "ppl": {length: ppl},
    "eval_s": seconds}``."""
    from megatron_endprompt.cli import eval as ev

    t0 = time.time()
    common = ["--hf-dir", hf, "--lengths", c["lengths"], "--seed", "42", "--device", "cpu",
              "--batch-size", str(c["eval_batch"]), "--no-progress"]
    tool(ev.main, [*common, "--tasks", "niah_single_1,ppl", "--samples", str(c["samples"]),
                   "--ppl-data", ppl_data, "--ppl-max-windows", str(c["ppl_windows"]),
                   "--output", out_prefix + "_niah.json"], quiet=True)
    per_depth = max(1, c["samples"] // 5)
    depths = PASSKEY_DEPTHS if c["samples"] >= 5 else "0.5"
    tool(ev.main, [*common, "--tasks", "passkey", "--depths", depths, "--samples",
                   str(per_depth), "--output", out_prefix + "_passkey.json"], quiet=True)
    held = [t for t in HELD_OUT_TASKS if t in str(c.get("held_out", "")).split(",")]
    fits = held_out_lengths(hf, held, [int(n) for n in c["lengths"].split(",")])
    for t in held:  # each task at the lengths its smallest prompt fits (the rest: not run)
        if fits[t]:
            argv = [*common, "--tasks", t, "--samples", str(c["samples"]),
                    "--output", f"{out_prefix}_held_{t}.json"]
            argv[argv.index("--lengths") + 1] = ",".join(map(str, fits[t]))
            tool(ev.main, argv, quiet=True)
    with open(out_prefix + "_niah.json", encoding="utf-8") as f:
        niah = json.load(f)
    with open(out_prefix + "_passkey.json", encoding="utf-8") as f:
        pk = json.load(f)
    ppl = {n: (e["ppl"] if e else None) for n, e in niah.get("ppl", {}).get("by_length",
                                                                              {}).items()}
    out = {"counts": {"niah_single_1": stats.counts(niah, "niah_single_1"),
                      "passkey": stats.counts(pk, "passkey")},
           "ppl": ppl, "eval_s": round(time.time() - t0, 1)}
    for t in held:
        if fits[t]:
            with open(f"{out_prefix}_held_{t}.json", encoding="utf-8") as f:
                out["counts"][t] = stats.counts(json.load(f), t)
        else:
            out["counts"][t] = {}
    out["not_run"] = {t: [n for n in c["lengths"].split(",") if int(n) not in fits[t]]
                      for t in held if len(fits[t]) < len(c["lengths"].split(","))}
    line = " ".join(f"{t}@{n}={k:.0f}/{m}" for t in EVAL_TASKS
                    for n, (k, m) in out["counts"][t].items())
    print(f"  eval {os.path.basename(out_prefix)}: {line} ppl={ppl} ({out['eval_s']:.0f} s)",
          flush=True)
    return out
