"""Data-path benchmark: our EndPrompt preprocessing and dataset against plain Megatron.

What is measured, in one run, on ``--corpus`` (tiny Shakespeare by default) split into JSONL
documents (blank-line-separated paragraphs grouped into documents of ``--doc-chars``
characters) and repeated ``--repeat`` times:

1. Preprocessing tokens/s, each tool run as a user runs it (a fresh interpreter, ``--workers``
   workers, ``--append-eod``, the same input and the same tokenizer):

   * ours: ``tools/preprocess_endprompt.py`` (continuation terminal, fixed placement,
     ``--seq-length``/``--target-length``/``--terminal-length``), which also writes the sidecar;
   * Megatron-LM: the real ``tools/preprocess_data.py`` of the checkout given with
     ``--megatron-lm PATH`` (run with ``PYTHONPATH=PATH``; its code is never copied here).
     Without ``--megatron-lm``, an in-process replica of its loop is timed instead (a
     ``multiprocessing.Pool`` of ``--workers`` processes, ``imap(encode, lines, 32)``, one
     ``IndexedDatasetBuilder.add_document`` per document), labelled as such.

   The tokenizer (``--tokenizer hf``, default) is a GPT-2-style byte-level BPE
   ``tokenizer.json`` trained offline with ``tokenizers`` on the corpus, loaded by both tools as
   ``HuggingFaceTokenizer``; ``--tokenizer spm`` uses a SentencePiece model
   (``GPTSentencePieceTokenizer``). Each tool runs ``--trials`` times, alternating, best time
   kept. Reported: tokens/s by wall time end to end (the target's measure), the same net of
   start-up (each tool's best time on a one-sample input: imports, tokenizer load), tokens per
   CPU-second of the tool and its children (``os.wait4``) end to end and net of the start-up's
   CPU — the figure other jobs on shared cores disturb least, and what the tools reach on free
   cores — and whether both wrote byte-identical ``.bin/.idx``.
   ``--long-line-mb M`` also runs ours on one JSONL line of ``M`` MB and reports its peak RSS.
   With ``--tokenizer hf``, the **ceiling**: ``Tokenizer.encode_batch_fast`` alone over the same
   documents held in memory (a fresh process, ``--workers`` rayon threads, no reading, parsing,
   writing or start-up; best of ``--trials``), an upper bound on the tokens/s of any tool that
   uses this tokenizer unchanged, and its ratio to Megatron-LM's end-to-end figure.

2. Dataset samples/s at P = ``--seq-length``: ``EndPromptGPTDataset`` on our prefix against
   Megatron-Core's ``GPTDataset`` on Megatron's prefix (same tokens), both built through
   ``BlendedMegatronDatasetBuilder`` (one epoch, ``create_attention_mask=False``); ``ds[i]`` for
   every sample, one warm-up pass then the best of ``--passes`` timed passes, single process.

3. Sidecar bytes / ``.bin`` bytes of our prefix.

Targets (issue 10): preprocessing >= 2.5x Megatron-LM's ``preprocess_data.py``; (issue 2)
dataset >= 0.9x ``GPTDataset``, sidecar <= 0.1% of ``.bin``. Prints a table and writes
``--out`` (JSON).

    .venv/bin/python benchmarks/bench_data_path.py --megatron-lm /tmp/megatron-lm [--workers 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_ceiling import time_ceiling  # noqa: E402
from megatron_loop_replica import replica_preprocess  # noqa: E402
REPO = os.path.dirname(HERE)


# -- input --------------------------------------------------------------------------------
def write_jsonl(corpus: str, path: str, *, doc_chars: int, repeat: int) -> int:
    """Paragraphs of ``corpus`` grouped into documents of >= ``doc_chars`` characters, the whole
    set written ``repeat`` times as JSONL; returns the number of documents written."""
    with open(corpus, encoding="utf-8") as f:
        paragraphs = [p.strip() for p in f.read().split("\n\n") if p.strip()]
    docs: list[str] = []
    current: list[str] = []
    size = 0
    for p in paragraphs:
        current.append(p)
        size += len(p) + 2
        if size >= doc_chars:
            docs.append("\n\n".join(current))
            current, size = [], 0
    if current:
        docs.append("\n\n".join(current))
    lines = "".join(json.dumps({"text": d}) + "\n" for d in docs)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(repeat):
            f.write(lines)
    return len(docs) * repeat


# -- tokenizers -----------------------------------------------------------------------------
def build_gpt2_like(corpus_jsonl: str, directory: str, vocab_size: int) -> str:
    """A GPT-2-style ``tokenizer.json`` (byte-level BPE, ``<|endoftext|>``, no BOS) trained
    offline on the corpus, saved as a Hugging Face directory; returns the directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    with open(corpus_jsonl, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(texts, trainer=trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    eot = "<|endoftext|>"
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eot, eos_token=eot,
                            unk_token=eot).save_pretrained(directory)
    return directory


# -- running the tools ----------------------------------------------------------------------
def run_timed(cmd: list[str], env: dict | None = None) -> tuple[float, float, float]:
    """``(wall s, CPU s of the process and its children, peak RSS MiB)`` of one command."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}):\n{err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def ours_cmd(jsonl: str, prefix: str, tok: tuple[str, str], args) -> list[str]:
    return [sys.executable, os.path.join(REPO, "tools", "preprocess_endprompt.py"),
            "--input", jsonl, "--output-prefix", prefix, "--tokenizer-type", tok[0],
            "--tokenizer-model", tok[1], "--workers", str(args.workers), "--append-eod",
            "--seq-length", str(args.seq_length), "--target-length", str(args.target_length),
            "--terminal-length", str(args.terminal_length), "--no-progress"]


def megatron_cmd(jsonl: str, prefix: str, tok: tuple[str, str], args) -> list[str]:
    """Megatron-LM's real ``tools/preprocess_data.py`` (writes ``prefix_text_document.*``)."""
    return [sys.executable, os.path.join(args.megatron_lm, "tools", "preprocess_data.py"),
            "--input", jsonl, "--output-prefix", prefix, "--tokenizer-type", tok[0],
            "--tokenizer-model", tok[1], "--workers", str(args.workers), "--append-eod"]


def cpu_seconds() -> float:
    """User + system CPU time of this process and of its reaped children (pool workers)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def time_preprocessing(args, w, tok) -> dict:
    """Alternating best-of-``--trials`` runs of both tools, plus their start-up times."""
    env = dict(os.environ)
    if args.megatron_lm:
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(args.megatron_lm)]
                                            + [p for p in [env.get("PYTHONPATH")] if p])
    ours_env = dict(os.environ, PYTHONPATH=REPO)
    plain_prefix = w("plain_text_document") if args.megatron_lm else w("plain")
    out: dict = {k: {"wall": [], "cpu": [], "startup_wall": [], "startup_cpu": []}
                 for k in ("plain", "ours")}
    for name, jsonl in (("startup_wall", w("tiny.jsonl")), ("wall", w("input.jsonl"))):
        trials = args.trials if name == "wall" else max(2, args.trials // 2)
        for _ in range(trials):
            if args.megatron_lm:
                prefix = w("plain") if name == "wall" else w("tiny_plain")
                wall, cpu, _ = run_timed(megatron_cmd(jsonl, prefix, tok, args), env)
            else:
                t0, c0 = time.perf_counter(), cpu_seconds()
                replica_preprocess(jsonl, w("plain") if name == "wall" else w("tiny_plain"),
                                   tok, args.workers)
                wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
            out["plain"][name].append(wall)
            out["plain"]["cpu" if name == "wall" else "startup_cpu"].append(cpu)
            prefix = w("ours") if name == "wall" else w("tiny_ours")
            wall, cpu, _ = run_timed(ours_cmd(jsonl, prefix, tok, args), ours_env)
            out["ours"][name].append(wall)
            out["ours"]["cpu" if name == "wall" else "startup_cpu"].append(cpu)
    out["identical_bin_idx"] = all(
        open(plain_prefix + s, "rb").read() == open(w("ours") + s, "rb").read()
        for s in (".bin", ".idx"))
    out["plain_prefix"] = plain_prefix
    if args.long_line_mb:
        with open(args.corpus, encoding="utf-8") as f:
            text = f.read()
        reps = -(-args.long_line_mb * 2**20 // len(text))
        with open(w("long.jsonl"), "w", encoding="utf-8") as f:
            f.write(json.dumps({"text": (text * reps)[: args.long_line_mb * 2**20]}) + "\n")
        wall, cpu, rss = run_timed(ours_cmd(w("long.jsonl"), w("long"), tok, args), ours_env)
        out["long_line"] = {"mb": args.long_line_mb, "wall": wall, "peak_rss_mib": rss}
    return out


# -- datasets -----------------------------------------------------------------------------
def build_dataset(cls: type, config_cls: type, prefix: str, tokenizer, args, cache: str,
                  **extra):
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder

    config = config_cls(
        random_seed=1234, sequence_length=args.seq_length, blend=([prefix], None),
        split="100,0,0", tokenizer=tokenizer, reset_position_ids=False,
        reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False,
        path_to_cache=cache, **extra)
    train, _, _ = BlendedMegatronDatasetBuilder(cls, [None, None, None], lambda: True,
                                                config).build()
    return train


def time_dataset(ds, passes: int) -> tuple[int, float, float]:
    """``(samples per pass, samples/s, samples/s/core)``: ``ds[i]`` for every ``i``, one warm-up
    pass, then the best of ``passes`` timed passes by wall clock and by process CPU time (CPU
    time is the per-core figure and is robust to other load on the machine)."""
    n = len(ds)
    for i in range(n):
        ds[i]
    best_wall = best_cpu = 0.0
    for _ in range(passes):
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(n):
            ds[i]
        best_wall = max(best_wall, n / (time.perf_counter() - t0))
        best_cpu = max(best_cpu, n / max(time.process_time() - c0, 1e-9))
    return n, best_wall, best_cpu


# -- main ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shared = os.path.join(REPO, "..", "shared", "corpus", "tinyshakespeare.txt")
    p.add_argument("--corpus", default=shared if os.path.isfile(shared) else
                   "/work/shared/corpus/tinyshakespeare.txt")
    p.add_argument("--megatron-lm", default=None,
                   help="a Megatron-LM checkout: time its real tools/preprocess_data.py")
    p.add_argument("--tokenizer", choices=("hf", "spm"), default="hf")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seq-length", type=int, default=8192)
    p.add_argument("--target-length", type=int, default=65536)
    p.add_argument("--terminal-length", type=int, default=512)
    p.add_argument("--repeat", type=int, default=16, help="copies of the corpus in the input")
    p.add_argument("--doc-chars", type=int, default=4000, help="characters per document")
    p.add_argument("--vocab-size", type=int, default=16384, help="tokenizer vocabulary")
    p.add_argument("--trials", type=int, default=3, help="preprocessing runs per tool (best)")
    p.add_argument("--passes", type=int, default=20, help="timed dataset passes (best)")
    p.add_argument("--long-line-mb", type=int, default=0,
                   help="also run ours on one JSONL line of this many MB (peak RSS)")
    p.add_argument("--workdir", default=os.path.join(HERE, "out", "data_path"))
    p.add_argument("--out", default=os.path.join(HERE, "out", "data_path.json"))
    args = p.parse_args(argv)

    from megatron_endprompt.compat import build_megatron_tokenizer, quiet_megatron_import_noise

    quiet_megatron_import_noise()
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    from megatron_endprompt.data.dataset import EndPromptDatasetConfig, EndPromptGPTDataset
    from megatron_endprompt.data.synthetic import train_sentencepiece

    if not os.path.isfile(args.corpus):
        sys.exit(f"--corpus {args.corpus}: not a file")
    if args.megatron_lm and not os.path.isfile(os.path.join(args.megatron_lm, "tools",
                                                            "preprocess_data.py")):
        sys.exit(f"--megatron-lm {args.megatron_lm}: no tools/preprocess_data.py there")
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    w = lambda name: os.path.join(args.workdir, name)  # noqa: E731
    write_jsonl(args.corpus, w("one_copy.jsonl"), doc_chars=args.doc_chars, repeat=1)
    n_docs = write_jsonl(args.corpus, w("input.jsonl"), doc_chars=args.doc_chars,
                         repeat=args.repeat)
    with open(w("one_copy.jsonl"), encoding="utf-8") as f, open(w("tiny.jsonl"), "w") as g:
        for line in itertools.islice(f, 3 * args.seq_length // 1000 + 2):  # one sample's worth
            g.write(line)
    if args.tokenizer == "hf":
        tok = ("HuggingFaceTokenizer", build_gpt2_like(w("one_copy.jsonl"), w("gpt2_like"),
                                                       args.vocab_size))
    else:
        tok = ("GPTSentencePieceTokenizer",
               train_sentencepiece(w("one_copy.jsonl"), w("spm"), vocab_size=args.vocab_size))
    tokenizer = build_megatron_tokenizer(*tok)

    # 1. preprocessing, alternating the tools, best of --trials
    pre = time_preprocessing(args, w, tok)
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ours_data = IndexedDataset(w("ours"))  # keep it alive: its arrays view its memory map
    tokens = int(ours_data.sequence_lengths.sum())
    del ours_data
    best = {k: min(pre[k]["wall"]) for k in ("plain", "ours")}
    start = {k: min(pre[k]["startup_wall"]) for k in ("plain", "ours")}
    net = {k: max(best[k] - start[k], 1e-9) for k in best}
    cpu = {k: min(pre[k]["cpu"]) for k in best}
    cpu_net = {k: max(cpu[k] - min(pre[k]["startup_cpu"]), 1e-9) for k in best}
    ceiling = (time_ceiling(args.workers, args.trials, w("input.jsonl"), tok[1])
               if args.tokenizer == "hf" else None)
    if ceiling is not None and ceiling["tokens"] != tokens:
        sys.exit(f"ceiling: {ceiling['tokens']:,} tokens from the bare tokenizer, "
                 f"{tokens:,} in our .bin")

    # 2. datasets on the same tokens
    cache = w("index_cache")
    gpt = build_dataset(GPTDataset, GPTDatasetConfig, pre["plain_prefix"], tokenizer, args, cache)
    ours = build_dataset(EndPromptGPTDataset, EndPromptDatasetConfig, w("ours"), tokenizer,
                         args, cache, endprompt_target_length=args.target_length)
    assert ours.sidecar is not None and tuple(ours[0]["tokens"].shape) == (args.seq_length,)
    n_gpt, sps_gpt, core_gpt = time_dataset(gpt, args.passes)
    n_ours, sps_ours, core_ours = time_dataset(ours, args.passes)

    # 3. sidecar size
    side, binary = os.path.getsize(w("ours.endprompt")), os.path.getsize(w("ours.bin"))

    plain_name = "Megatron-LM tools/preprocess_data.py" if args.megatron_lm else \
        "replica of preprocess_data.py's loop"
    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "loadavg_at_end": os.getloadavg()},
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "workdir")}
        | {"documents": n_docs, "tokens": tokens, "tokenizer_type": tok[0],
           "plain": plain_name},
        "preprocess": {
            **{f"{k}_{m}": pre[k][m] for k in ("plain", "ours")
               for m in ("wall", "cpu", "startup_wall", "startup_cpu")},
            "plain_tokens_per_s": tokens / best["plain"], "ours_tokens_per_s": tokens / best["ours"],
            "ratio": best["plain"] / best["ours"],
            "ratio_net": net["plain"] / net["ours"] if min(net.values()) > 1e-6 else None,
            "target_ratio": 2.5,
            "plain_tokens_per_cpu_s_net": tokens / cpu_net["plain"],
            "ours_tokens_per_cpu_s_net": tokens / cpu_net["ours"],
            "cpu_ratio_net": cpu_net["plain"] / cpu_net["ours"],
            "plain_tokens_per_cpu_s": tokens / cpu["plain"],
            "ours_tokens_per_cpu_s": tokens / cpu["ours"], "cpu_ratio": cpu["plain"] / cpu["ours"],
            "identical_bin_idx": pre["identical_bin_idx"],
            "ceiling": ceiling and {
                **ceiling, "tokens_per_s": tokens / ceiling["wall"],
                "tokens_per_cpu_s": tokens / ceiling["cpu"],
                "ratio_to_plain": best["plain"] / ceiling["wall"],
                "ratio_to_plain_net": net["plain"] / ceiling["wall"],
                "ours_fraction": ceiling["wall"] / best["ours"]},
            "long_line": pre.get("long_line"),
        },
        "dataset": {
            "gpt_samples": n_gpt, "ours_samples": n_ours,
            "gpt_samples_per_s": sps_gpt, "ours_samples_per_s": sps_ours,
            "ratio": sps_ours / sps_gpt, "target_ratio": 0.9,
            "gpt_samples_per_s_per_core": core_gpt, "ours_samples_per_s_per_core": core_ours,
        },
        "sidecar": {"sidecar_bytes": side, "bin_bytes": binary, "fraction": side / binary,
                    "target_fraction": 0.001},
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)

    r = result["preprocess"]
    ok = lambda good: "ok" if good else "MISSED"  # noqa: E731
    rows = [
        (f"preprocess tokens/s  {plain_name[:26]}", f"{r['plain_tokens_per_s']:,.0f}", ""),
        ("preprocess tokens/s  ours", f"{r['ours_tokens_per_s']:,.0f}", ""),
        ("preprocess ratio (wall, end to end)", f"{r['ratio']:.2f}x",
         f">= 2.5x {ok(r['ratio'] >= 2.5)}"),
        ("preprocess start-up s  plain / ours", f"{start['plain']:.1f} / {start['ours']:.1f}", ""),
        ("preprocess wall ratio net of start-up",
         f"{r['ratio_net']:.2f}x" if min(net.values()) > 1e-6 else "n/a (start-up > run)",
         "(noisy on a shared machine)"),
        ("preprocess tokens/CPU-s  plain / ours", f"{r['plain_tokens_per_cpu_s']:,.0f} / "
         f"{r['ours_tokens_per_cpu_s']:,.0f}", f"{r['cpu_ratio']:.2f}x"),
        ("tokens/CPU-s net of start-up  plain / ours", f"{r['plain_tokens_per_cpu_s_net']:,.0f} / "
         f"{r['ours_tokens_per_cpu_s_net']:,.0f}", f"{r['cpu_ratio_net']:.2f}x"),
        ("identical .bin/.idx", str(r["identical_bin_idx"]), ""),
    ]
    if r["ceiling"]:
        c = r["ceiling"]
        rows += [
            ("ceiling: bare encode_batch_fast tokens/s", f"{c['tokens_per_s']:,.0f}",
             f"{args.workers} rayon threads, in memory, {c['batch_docs']} docs per call"),
            ("ceiling / Megatron-LM (end to end)", f"{c['ratio_to_plain']:.2f}x",
             "any tool with this tokenizer: <= this ratio"),
            ("ceiling / Megatron-LM net of its start-up", f"{c['ratio_to_plain_net']:.2f}x", ""),
            ("ceiling tokens/CPU-s", f"{c['tokens_per_cpu_s']:,.0f}", ""),
        ]
    rows += [
        ("dataset samples/s  GPTDataset", f"{sps_gpt:,.0f}", ""),
        ("dataset samples/s  EndPromptGPTDataset", f"{sps_ours:,.0f}",
         f"{result['dataset']['ratio']:.2f}x >= 0.9x {ok(result['dataset']['ratio'] >= 0.9)}"),
        ("sidecar / .bin", f"{100 * side / binary:.4f}% ({side:,} / {binary:,} B)",
         f"<= 0.1% {ok(side / binary <= 0.001)}"),
    ]
    if r["long_line"]:
        rows.append((f"ours on one {args.long_line_mb} MB line: peak RSS",
                     f"{r['long_line']['peak_rss_mib']:,.0f} MiB", f"{r['long_line']['wall']:.1f} s"))
    print(f"\n{n_docs:,} documents, {tokens:,} tokens, {tok[0]}, workers {args.workers}, "
          f"P={args.seq_length}, L={args.target_length}, b={args.terminal_length}; "
          f"{n_ours} / {n_gpt} samples (ours / GPTDataset); load average {os.getloadavg()}")
    for name, value, target in rows:
        print(f"  {name:<44} {value:>30}  {target}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
