"""The stages of ``benchmarks/gpu/real_model.sh``: a real small pretrained Llama-architecture
checkpoint (SmolLM2-135M-Instruct: 30 layers, hidden 576, 9 heads / 3 KV groups, tied
embeddings, rope_theta 100000, an 8K window) extended 8K -> 32K (``s = 4``) two ways at equal
tokens, then evaluated with passkey and ``niah_single_1`` at 8K / 16K / 32K; one JSON.

* ``endprompt``: EndPrompt samples of ``P = 8192`` tokens (``--terminal-source document-tail
  --placement random``: a document's head at ``0..a-1``, its last ``b`` tokens at a random
  start in ``[a, L-b]``), RoPE positions divided by ``s``.
* ``pi``: position interpolation fine-tuning alone: the *same* samples (the same sidecar with
  every terminal start set to ``a``, ``benchmarks.replication.controls.make_contiguous``), so
  positions are contiguous ``0..P-1``, the same tokens, steps and ``s``.

Stages (each a subprocess with its own time limit, each recorded whatever the others do):
``convert`` (hf-to-megatron), ``preprocess`` (the model's own tokenizer; documents are the
shipped public-domain haystack text, the device machine has no network), ``pi_data``,
``train_endprompt`` / ``train_pi`` (``examples/pretrain_llama3_endprompt.sh``, no model flag:
the model comes from the checkpoint's conversion record; local transformer spec), ``export_*``
(megatron-to-hf with ``s``) and ``eval_*`` (``megatron_endprompt.cli.eval``); plus ``eval_base``
(the checkpoint itself under PI ``s``, untrained) for reference.

``--dry-run`` prints every stage's command and writes the JSON with each stage ``planned``
(nothing is run, no torch imported). ``--cpu-smoke`` runs every stage for real on the CPU with a
tiny random Llama carrying the real model's tokenizer and config shape family (2 layers,
hidden 64, tied), fp32, 2 iterations, ``L0 = 256 -> L = 1024``; it checks the stage machinery.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time

from benchmarks.paths import OUT, REPO
from benchmarks.replication.controls import make_contiguous
from megatron_endprompt.data.sidecar.sidecar import sidecar_path
from megatron_endprompt.disk import write_text

SCRIPT = os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")
HAYSTACK = os.path.join(REPO, "megatron_endprompt", "evaluation", "assets",
                        "haystack_shakespeare.txt.gz")
TOTAL_BUDGET_S = 560  # the shell wrapper's set-up comes on top: under 10 minutes in all


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sizes:
    """One run's sizes (the GPU run or the CPU smoke)."""

    name: str
    """``gpu`` or ``cpu-smoke``."""
    original: int
    """L0, the model's window the training starts from (tokens)."""
    target: int
    """L, the window trained for; ``s = L / L0``."""
    seq: int
    """P, the physical training length (tokens)."""
    terminal: int
    """b, the EndPrompt terminal tokens of a sample."""
    docs: int
    """Documents cut from the haystack text (each longer than P)."""
    doc_words: int
    """Words per document."""
    iters: int
    """Optimizer steps of each method (the same for both: equal tokens)."""
    global_batch: int
    """Samples per step."""
    lr: float
    """Peak learning rate (cosine to 10 %, no warm-up beyond ``iters // 10``)."""
    eval_lengths: tuple[int, ...]
    """Evaluation lengths (tokens)."""
    samples: int
    """Prompts per task x length (x depth for passkey)."""
    precision: str
    """``bf16`` or ``fp32``."""
    device: str
    """Evaluation device."""


GPU = Sizes(name="gpu", original=8192, target=32768, seq=8192, terminal=256, docs=160,
            doc_words=9000, iters=60, global_batch=8, lr=2e-5,
            eval_lengths=(8192, 16384, 32768), samples=3, precision="bf16", device="cuda")
SMOKE = Sizes(name="cpu-smoke", original=256, target=1024, seq=128, terminal=16, docs=6,
              doc_words=200, iters=2, global_batch=2, lr=1e-4, eval_lengths=(256, 512),
              samples=1, precision="fp32", device="cpu")

TASKS = "passkey,niah_single_1"
METHODS = ("endprompt", "pi")


def pi_factor(sz: Sizes) -> int:
    """``s = ceil(L / L0)``, as the launcher derives it."""
    return -(-sz.target // sz.original)


def write_corpus(path: str, sz: Sizes) -> int:
    """``sz.docs`` documents of ``sz.doc_words`` consecutive words of the shipped haystack
    text (wrapping around), one JSON line each; returns the count."""
    with gzip.open(HAYSTACK, "rt", encoding="utf-8") as f:
        words = f.read().split()
    lines = []
    for i in range(sz.docs):
        start = (i * sz.doc_words * 7919) % len(words)
        doc = [words[(start + j) % len(words)] for j in range(sz.doc_words)]
        lines.append(json.dumps({"text": " ".join(doc)}))
    write_text(path, "\n".join(lines) + "\n")
    return len(lines)


def make_tiny_hf(hf_real: str, out: str, sz: Sizes) -> None:
    """A random 2-layer Llama with the real model's tokenizer, tied embeddings and RoPE base,
    window ``sz.original`` (the CPU smoke's stand-in for the 135M weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    real = AutoConfig.from_pretrained(hf_real)
    cfg = AutoConfig.for_model(
        "llama", vocab_size=real.vocab_size, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=sz.original, tie_word_embeddings=True,
        rms_norm_eps=real.rms_norm_eps, bos_token_id=real.bos_token_id,
        eos_token_id=real.eos_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0})
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(out)
    AutoTokenizer.from_pretrained(hf_real).save_pretrained(out)


def plan(sz: Sizes, hf_dir: str, work: str, out_dir: str) -> list[dict]:
    """Every stage: ``name``, ``cmd`` (argv), ``env`` (additions), ``limit_s``."""
    py, s = sys.executable, pi_factor(sz)
    w = lambda *p: os.path.join(work, *p)  # noqa: E731
    stages = [dict(name="convert", limit_s=120, env={}, cmd=[
        py, "-m", "megatron_endprompt.cli.convert", "hf-to-megatron", "--hf-dir", hf_dir,
        "--output", w("base"), "--overwrite", "--no-progress"])]
    stages.append(dict(name="preprocess", limit_s=120, env={}, cmd=[
        py, "-m", "megatron_endprompt.cli.preprocess", "--input", w("corpus.jsonl"),
        "--output-prefix", w("ep"), "--tokenizer-type", "HuggingFaceTokenizer",
        "--tokenizer-model", hf_dir, "--seq-length", str(sz.seq), "--target-length",
        str(sz.target), "--terminal-length", str(sz.terminal), "--placement", "random",
        "--terminal-source", "document-tail", "--append-eod", "--no-progress"]))
    stages.append(dict(name="pi_data", limit_s=60, env={}, cmd=[
        py, "-m", "benchmarks.gpu.real_model", "--make-pi-data", w("ep"), w("pi")]))
    for m in METHODS:
        env = {"CHECKPOINT_IN": w("base"), "CHECKPOINT_OUT": w(f"ckpt_{m}"),
               "TOKENIZER": hf_dir, "DATA_PREFIX": w("ep" if m == "endprompt" else "pi"),
               "GPUS_PER_NODE": "1", "TP": "1", "MICRO_BATCH": "1",
               "GLOBAL_BATCH": str(sz.global_batch), "TRAIN_ITERS": str(sz.iters),
               "LR": str(sz.lr), "WARMUP_ITERS": str(max(sz.iters // 10, 0)),
               "SEQ_LENGTH": str(sz.seq), "TARGET_LENGTH": str(sz.target),
               "PI_FACTOR": str(s), "SPLIT": "100,0,0", "EVAL_ITERS": "0",
               "SAVE_INTERVAL": str(sz.iters), "PRECISION": sz.precision,
               "LOG_INTERVAL": "1",
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2" if sz.device == "cpu"
                                                 else "4")}
        stages.append(dict(name=f"train_{m}", limit_s=150, env=env, cmd=[
            "bash", SCRIPT, "--transformer-impl", "local", "--num-workers", "0",
            "--no-save-optim", "--no-save-rng", "--endprompt-loss-log", w(f"loss_{m}"),
            # the local spec's unfused attention keeps [heads, P, P] scores per layer:
            # recompute them in the backward (selective recompute) on the GPU
            *(["--recompute-activations"] if sz.device == "cuda" else [])]))
        stages.append(dict(name=f"export_{m}", limit_s=60, env={}, cmd=[
            py, "-m", "megatron_endprompt.cli.convert", "megatron-to-hf", "--checkpoint",
            w(f"ckpt_{m}"), "--output", w(f"hf_{m}"), "--tokenizer", hf_dir, "--overwrite",
            "--no-progress"]))
    # the trained models first; the untrained reference last (the budget may cut it)
    for m, model in (*((m, w(f"hf_{m}")) for m in METHODS), ("base", None)):
        if model is None:  # the untouched checkpoint under PI s: what training starts from
            stages.append(dict(name="export_base", limit_s=60, env={}, cmd=[
                py, "-m", "megatron_endprompt.cli.convert", "megatron-to-hf", "--checkpoint",
                w("base"), "--output", w("hf_base"), "--tokenizer", hf_dir,
                "--target-length", str(sz.target), "--pi-factor", str(s), "--overwrite",
                "--no-progress"]))
            model = w("hf_base")
        stages.append(dict(name=f"eval_{m}", limit_s=120, env={}, cmd=[
            py, "-m", "megatron_endprompt.cli.eval", "--hf-dir", model, "--tasks", TASKS,
            "--lengths", ",".join(map(str, sz.eval_lengths)), "--samples", str(sz.samples),
            "--device", sz.device, "--dtype", "bfloat16" if sz.precision == "bf16"
            else "float32", "--output", w(f"eval_{m}.json"), "--no-progress"]))
    return stages


def make_pi_data(src: str, dst: str) -> int:
    """``dst``: ``src``'s tokens (hard links or copies) and sidecar with contiguous positions."""
    for ext in (".bin", ".idx"):
        if os.path.exists(dst + ext):
            os.remove(dst + ext)
        try:
            os.link(src + ext, dst + ext)
        except OSError:
            shutil.copyfile(src + ext, dst + ext)
    shutil.copyfile(sidecar_path(src), sidecar_path(dst))
    return make_contiguous(sidecar_path(dst))


def _scores(path: str) -> dict:
    """``{task: {length: score}}`` of an eval JSON."""
    with open(path, encoding="utf-8") as f:
        res = json.load(f)
    return {t: e.get("scores", {}) for t, e in res.get("tasks", {}).items()}


def _run(stage: dict, log: str, deadline: float) -> dict:
    limit = max(1, min(stage["limit_s"], int(deadline - time.monotonic())))
    env = {**os.environ, **stage["env"]}
    if stage["name"].startswith("train_"):  # a free rendezvous port (not the default 6000)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            env["MASTER_PORT"] = str(sock.getsockname()[1])
    t0 = time.monotonic()
    with open(log, "w", encoding="utf-8") as f:
        try:
            rc = subprocess.run(stage["cmd"], env=env, stdout=f,
                                stderr=subprocess.STDOUT, timeout=limit, cwd=REPO).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    with open(log, encoding="utf-8", errors="replace") as f:
        tail = f.read()[-1500:]
    return {"status": "ok" if rc == 0 else ("timeout" if rc == 124 else "failed"), "rc": rc,
            "wall_s": round(time.monotonic() - t0, 1), "limit_s": limit, "log": log,
            **({} if rc == 0 else {"tail": tail})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the stages; JSON 'planned'")
    mode.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU")
    mode.add_argument("--make-pi-data", nargs=2, metavar=("SRC", "DST"), help=argparse.SUPPRESS)
    ap.add_argument("--hf-dir", default=os.environ.get("REAL_MODEL_HF", os.path.join(
        REPO, ".real_model", "hf")), help="the prepared HF directory (real_model.sh --prepare)")
    ap.add_argument("--work-dir", default=os.path.join(OUT, "real_model_work"))
    ap.add_argument("--out-dir", default=os.environ.get("OUT") or OUT)
    args = ap.parse_args(argv)
    if args.make_pi_data:
        print(f"pi data: {make_pi_data(*args.make_pi_data)} samples, contiguous positions")
        return 0
    sz = SMOKE if args.cpu_smoke else GPU
    out_json = os.path.join(args.out_dir, "real_model.json")
    if not args.dry_run and not os.path.isfile(os.path.join(args.hf_dir, "config.json")):
        print(f"error: --hf-dir {args.hf_dir}: no config.json; build it with "
              "`bash benchmarks/gpu/real_model.sh --prepare` (needs the package registry) "
              "and carry .real_model with the run", file=sys.stderr)
        return 2
    os.makedirs(args.work_dir, exist_ok=True)
    os.makedirs(args.out_dir, exist_ok=True)
    hf = args.hf_dir
    if args.cpu_smoke:
        hf = os.path.join(args.work_dir, "tiny_hf")
        make_tiny_hf(args.hf_dir, hf, sz)
    stages = plan(sz, hf, args.work_dir, args.out_dir)
    result = {"sizes": dataclasses.asdict(sz), "pi_factor": pi_factor(sz), "hf_dir": hf,
              "tasks": TASKS.split(","), "methods": list(METHODS),
              "tokens_per_method": sz.iters * sz.global_batch * sz.seq, "stages": {}}
    if not args.dry_run:
        write_corpus(os.path.join(args.work_dir, "corpus.jsonl"), sz)
    deadline = time.monotonic() + TOTAL_BUDGET_S
    for st in stages:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in st["env"].items())
        print(f"[{st['name']}] {env + ' ' if env else ''}{shlex.join(st['cmd'])}", flush=True)
        if args.dry_run:
            result["stages"][st["name"]] = {"status": "planned", "cmd": st["cmd"],
                                            "env": st["env"], "limit_s": st["limit_s"]}
            continue
        rec = _run(st, os.path.join(args.work_dir, f"{st['name']}.log"), deadline)
        if st["name"].startswith("eval_") and rec["status"] == "ok":
            rec["scores"] = _scores(st["cmd"][st["cmd"].index("--output") + 1])
        result["stages"][st["name"]] = rec
        print(f"[{st['name']}] {rec['status']} in {rec['wall_s']} s", flush=True)
        write_text(out_json, json.dumps(result, indent=1) + "\n")
    write_text(out_json, json.dumps(result, indent=1) + "\n")
    print(f"wrote {out_json}")
    return 0 if all(r["status"] in ("ok", "planned") for r in result["stages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
