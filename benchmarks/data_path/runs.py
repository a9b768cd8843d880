"""The preprocessing runs of ``data_path/bench.py``: input, tokenizers, alternating timed runs.

Each tool runs as a user runs it (a fresh interpreter, the same input, tokenizer and
``--workers``): Megatron-LM's ``tools/preprocess_data.py`` (or a replica of its loop without
``--megatron-lm``), ours forced onto the HF ``tokenizers`` path (``--tokenizer-backend hf``)
and ours on the tiktoken path (``--tokenizer-backend tiktoken``, byte-level BPE only), in turn,
``--trials`` times each; every ``.bin/.idx`` is compared byte for byte with Megatron's.
Ours first runs once *cold* (an empty tokenizer-verdict cache: Megatron's tokenizer is built
and compared with ``tokenizer.json``, :mod:`megatron_endprompt.data.tokenize.tokenizer_verdict`),
timed apart; the alternating runs then find the verdict (a fresh cache in the work directory).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

from benchmarks.data_path.megatron_loop_replica import replica_preprocess
from benchmarks.paths import REPO

#: our variants: result key -> --tokenizer-backend
OURS = {"ours_hf": "hf", "ours": "tiktoken"}


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
def _alphabet(missing: frozenset[int]) -> list[str]:
    """The byte-level alphabet (one symbol per byte) without the ``missing`` bytes."""
    from tokenizers import pre_tokenizers

    from megatron_endprompt.data.tokenize.tiktoken_bpe import _unicode_to_byte

    byte_of = _unicode_to_byte()
    return [c for c in pre_tokenizers.ByteLevel.alphabet() if byte_of[c] not in missing]


def build_gpt2_like(corpus_jsonl: str, directory: str, vocab_size: int, *,
                    missing: frozenset[int] = frozenset()) -> str:
    """A GPT-2-style ``tokenizer.json`` (byte-level BPE, ``<|endoftext|>``, no BOS) trained
    offline on the corpus, saved as a Hugging Face directory; returns the directory.
    ``missing``: single bytes left out of the alphabet (a real vocabulary's never-seen bytes)."""
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
        initial_alphabet=_alphabet(missing)))
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


def ours_cmd(jsonl: str, prefix: str, tok: tuple[str, str], args,
             backend: str = "auto") -> list[str]:
    return [sys.executable, os.path.join(REPO, "tools", "preprocess_endprompt.py"),
            "--tokenizer-backend", backend,
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
    # our tokenizer-verdict cache starts empty (never the user's ~/.cache): the first run of
    # ours below is the cold one (Megatron's tokenizer built and compared, verdict written),
    # timed on its own; every later run of ours finds the verdict
    ours_env = dict(os.environ, PYTHONPATH=REPO, MEGATRON_ENDPROMPT_CACHE=w("verdict_cache"))
    plain_prefix = w("plain_text_document") if args.megatron_lm else w("plain")
    ours = OURS if args.tokenizer != "spm" else {"ours": "auto"}
    out: dict = {k: {"wall": [], "cpu": [], "startup_wall": [], "startup_cpu": []}
                 for k in ("plain", *ours)}
    cold_key = "ours" if "ours" in ours else next(iter(ours))
    wall, cpu, _ = run_timed(ours_cmd(w("input.jsonl"), w("cold_" + cold_key), tok, args,
                                      ours[cold_key]), ours_env)
    out["cold"] = {"key": cold_key, "wall": wall, "cpu": cpu,
                   "verdict_written": bool(os.listdir(os.path.join(w("verdict_cache"),
                                                                   "tokenizer-verdicts")))
                   if os.path.isdir(w("verdict_cache")) else False}
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
            for key, backend in ours.items():
                prefix = w(key) if name == "wall" else w("tiny_" + key)
                wall, cpu, _ = run_timed(ours_cmd(jsonl, prefix, tok, args, backend), ours_env)
                out[key][name].append(wall)
                out[key]["cpu" if name == "wall" else "startup_cpu"].append(cpu)
    out["identical_bin_idx"] = {key: all(
        open(plain_prefix + s, "rb").read() == open(w(key) + s, "rb").read()
        for s in (".bin", ".idx")) for key in [*ours, "cold_" + cold_key]}
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


