"""The ceiling row of ``data_path/bench.py``: ``Tokenizer.encode_batch_fast`` alone.

Why: an upper bound for any preprocessing tool that uses the tokenizer unchanged -- the same
documents, in memory, ``--workers`` rayon threads, no start-up, no I/O, no writing. If this
bound divided by Megatron-LM's ``tools/preprocess_data.py`` throughput is below a target, no
tool reaches that target with this tokenizer on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from benchmarks.paths import REPO


# -- the ceiling: bare Rust encoding ------------------------------------------------------
def ceiling_child(jsonl: str, tokenizer_dir: str, trials: int, workers: int = 2) -> None:
    """In a fresh process whose rayon pool has ``RAYON_RS_NUM_THREADS`` threads: read every
    document into memory, then time ``Tokenizer.encode_batch_fast`` alone over them (no I/O,
    no start-up, no writing), in batches of 1,024 documents (ours) and in one call; print the
    best of ``trials`` per batch size as JSON (tokens count one EOD per document)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    with open(jsonl, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    out = {}
    for size in (1024, len(texts)):
        best = None
        for _ in range(trials):
            t0, c0 = time.perf_counter(), time.process_time()
            n = 0
            for i in range(0, len(texts), size):
                n += sum(len(e.ids) + 1 for e in tok.encode_batch_fast(
                    texts[i : i + size], add_special_tokens=True))
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if best is None or wall < best["wall"]:
                best = {"tokens": n, "wall": wall, "cpu": cpu}
        out[str(size)] = best
    from megatron_endprompt.data.tokenize.tiktoken_bpe import convert

    enc = convert(tok.to_str()).encoding
    if enc is not None:  # the bare tiktoken encoder on the same texts (+ BOS/EOD counted as HF)
        extra = len(tok.encode("a", add_special_tokens=True).ids) - len(
            tok.encode("a", add_special_tokens=False).ids) + 1
        best = None
        for _ in range(trials):
            t0, c0 = time.perf_counter(), time.process_time()
            n = 0
            for i in range(0, len(texts), 1024):
                n += sum(len(ids) + extra for ids in enc.encode_batch(
                    texts[i : i + 1024], num_threads=workers, allowed_special="all"))
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if best is None or wall < best["wall"]:
                best = {"tokens": n, "wall": wall, "cpu": cpu}
        best["same_token_count"] = n == out["1024"]["tokens"]
        out["tiktoken"] = best
    print(json.dumps(out))


def time_ceiling(workers: int, trials: int, jsonl: str, tok_dir: str) -> dict:
    """The best of :func:`ceiling_child` over batch sizes, with ``workers`` rayon threads."""
    env = dict(os.environ, RAYON_RS_NUM_THREADS=str(workers),
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    res = subprocess.run(
        [sys.executable, "-c", "import sys, benchmarks.data_path.ceiling as b; "
         "b.ceiling_child(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))",
         jsonl, tok_dir, str(trials), str(workers)],
        env=env, check=True, capture_output=True, text=True)
    runs = json.loads(res.stdout.strip().splitlines()[-1])
    bare_tiktoken = runs.pop("tiktoken", None)
    size, best = min(runs.items(), key=lambda kv: kv[1]["wall"])
    return {"batch_docs": int(size), **best, "runs": runs, "tiktoken": bare_tiktoken}
