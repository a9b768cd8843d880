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

Ours runs twice per trial: on the HF ``tokenizers`` path (``--tokenizer-backend
hf``) and on the tiktoken path (byte-level BPE); with an HF tokenizer the bare tiktoken
``encode_batch`` is timed next to the ceiling. ``--tokenizer gpt2|llama3`` picks the
GPT-2-style or the Llama-3-like tokenizer (:mod:`megatron_endprompt.data.prepare.synthetic`).

Targets: preprocessing >= 5x Megatron-LM's ``preprocess_data.py`` (the tiktoken path's goal);
dataset >= 0.9x ``GPTDataset``, sidecar <= 0.1% of ``.bin``. Prints a table and writes
``--out`` (JSON).

    .venv/bin/python -m benchmarks.data_path.bench --megatron-lm /tmp/megatron-lm [--workers 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import sys
import time

from benchmarks.data_path.ceiling import time_ceiling
from benchmarks.data_path.runs import build_gpt2_like, time_preprocessing, write_jsonl
from benchmarks.paths import OUT, REPO


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
    p.add_argument("--tokenizer", choices=("hf", "gpt2", "llama3", "spm"), default="hf",
                   help="hf/gpt2: GPT-2-style byte-level BPE; llama3: the Llama-3-like one "
                        "(split regex, BOS post-processor, special tokens); spm: SentencePiece")
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
    p.add_argument("--workdir", default=os.path.join(OUT, "data_path"))
    p.add_argument("--out", default=os.path.join(OUT, "data_path.json"))
    args = p.parse_args(argv)

    from megatron_endprompt import runtime
    from megatron_endprompt.compat import build_megatron_tokenizer

    runtime.quiet()
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    from megatron_endprompt.data.dataset import EndPromptDatasetConfig, EndPromptGPTDataset
    from megatron_endprompt.data.prepare.synthetic import (build_llama3_like_tokenizer,
                                                           train_sentencepiece)

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
    if args.tokenizer in ("hf", "gpt2"):
        tok = ("HuggingFaceTokenizer", build_gpt2_like(w("one_copy.jsonl"), w("gpt2_like"),
                                                       args.vocab_size))
    elif args.tokenizer == "llama3":
        with open(w("one_copy.jsonl"), encoding="utf-8") as f:
            texts = [json.loads(line)["text"] for line in f]
        tok = ("HuggingFaceTokenizer", build_llama3_like_tokenizer(
            texts, w("llama3_like"), vocab_size=args.vocab_size))
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
    keys = [k for k in ("plain", "ours_hf", "ours") if k in pre]
    best = {k: min(pre[k]["wall"]) for k in keys}
    start = {k: min(pre[k]["startup_wall"]) for k in keys}
    net = {k: max(best[k] - start[k], 1e-9) for k in best}
    cpu = {k: min(pre[k]["cpu"]) for k in best}
    cpu_net = {k: max(cpu[k] - min(pre[k]["startup_cpu"]), 1e-9) for k in best}
    ceiling = (time_ceiling(args.workers, args.trials, w("input.jsonl"), tok[1])
               if args.tokenizer != "spm" else None)
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
            **{f"{k}_{m}": pre[k][m] for k in keys
               for m in ("wall", "cpu", "startup_wall", "startup_cpu")},
            **{f"{k}_tokens_per_s": tokens / best[k] for k in keys},
            **{f"{k}_tokens_per_cpu_s": tokens / cpu[k] for k in keys},
            **{f"{k}_ratio": best["plain"] / best[k] for k in keys if k != "plain"},
            "ratio": best["plain"] / best["ours"],
            "ratio_net": net["plain"] / net["ours"] if min(net.values()) > 1e-6 else None,
            "target_ratio": 5.0,
            "plain_tokens_per_cpu_s_net": tokens / cpu_net["plain"],
            "ours_tokens_per_cpu_s_net": tokens / cpu_net["ours"],
            "cpu_ratio_net": cpu_net["plain"] / cpu_net["ours"],
            "cpu_ratio": cpu["plain"] / cpu["ours"],
            "identical_bin_idx": pre["identical_bin_idx"],
            "cold": pre["cold"] | {"ratio": best["plain"] / pre["cold"]["wall"]},
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
    rows = [(f"preprocess tokens/s  {plain_name[:26]}", f"{r['plain_tokens_per_s']:,.0f}", "")]
    if "ours_hf" in keys:
        rows.append(("preprocess tokens/s  ours, HF path", f"{r['ours_hf_tokens_per_s']:,.0f}",
                     f"{r['ours_hf_ratio']:.2f}x"))
    rows += [
        ("preprocess tokens/s  ours" + (", tiktoken path" if "ours_hf" in keys else ""),
         f"{r['ours_tokens_per_s']:,.0f}", ""),
        ("preprocess ratio (wall, end to end)", f"{r['ratio']:.2f}x",
         f">= 5x {ok(r['ratio'] >= 5)}"),
        ("preprocess start-up s  " + " / ".join(keys),
         " / ".join(f"{start[k]:.1f}" for k in keys), ""),
        ("preprocess wall ratio net of start-up",
         f"{r['ratio_net']:.2f}x" if min(net.values()) > 1e-6 else "n/a (start-up > run)",
         "(noisy on a shared machine)"),
        ("preprocess tokens/CPU-s  plain / ours", f"{r['plain_tokens_per_cpu_s']:,.0f} / "
         f"{r['ours_tokens_per_cpu_s']:,.0f}", f"{r['cpu_ratio']:.2f}x"),
        ("tokens/CPU-s net of start-up  plain / ours", f"{r['plain_tokens_per_cpu_s_net']:,.0f} / "
         f"{r['ours_tokens_per_cpu_s_net']:,.0f}", f"{r['cpu_ratio_net']:.2f}x"),
        (f"ours cold ({r['cold']['key']}: empty verdict cache) wall / CPU s",
         f"{r['cold']['wall']:.1f} / {r['cold']['cpu']:.1f}",
         f"{r['cold']['ratio']:.2f}x wall; verdict written: {r['cold']['verdict_written']}"),
        ("identical .bin/.idx to Megatron's", ", ".join(
            f"{k} {v}" for k, v in r["identical_bin_idx"].items()), ""),
    ]
    if r["ceiling"]:
        c = r["ceiling"]
        rows += [
            ("ceiling: bare encode_batch_fast tokens/s", f"{c['tokens_per_s']:,.0f}",
             f"{args.workers} rayon threads, in memory, {c['batch_docs']} docs per call"),
            ("bare tiktoken encode_batch tokens/s", f"{tokens / c['tiktoken']['wall']:,.0f}"
             if c.get("tiktoken") else "n/a (not convertible)",
             f"{args.workers} threads, in memory, same token count as HF: "
             f"{c.get('tiktoken', {}).get('same_token_count')}"),
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
                     f"{r['long_line']['peak_rss_mib']:,.0f} MiB",
                     f"{r['long_line']['wall']:.1f} s"))
    print(f"\n{n_docs:,} documents, {tokens:,} tokens, {tok[0]}, workers {args.workers}, "
          f"P={args.seq_length}, L={args.target_length}, b={args.terminal_length}; "
          f"{n_ours} / {n_gpt} samples (ours / GPTDataset); load average {os.getloadavg()}")
    for name, value, target in rows:
        print(f"  {name:<44} {value:>30}  {target}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
