"""Demo training: a tiny Llama trained by Megatron's real ``pretrain`` through our entry
point, under ``torchrun`` on CPU (gloo). Used by ``make demo`` and its test."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from megatron_endprompt.launch import free_port

#: A tiny Llama: RMSNorm, SwiGLU, RoPE, GQA, untied embeddings, no biases.
TINY_LLAMA: list[str] = [
    "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "176",
    "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
    "--position-embedding-type", "rope", "--rotary-base", "10000",
    "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
    "--untie-embeddings-and-output-weights", "--attention-dropout", "0", "--hidden-dropout", "0",
]

_ITER = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?lm loss: ([0-9.E+-]+)")

PARALLEL = {"tp2": ["--tensor-model-parallel-size", "2"],
            "pp2": ["--pipeline-model-parallel-size", "2"],
            "none": []}


def parse_losses(log: str) -> dict[int, float]:
    """``{iteration: lm loss}`` from Megatron's training log."""
    return {int(m.group(1)): float(m.group(2)) for m in _ITER.finditer(log)}


def run_pretrain(args: list[str], *, log_path: str, nproc: int = 2) -> tuple[int, str]:
    """``torchrun --nproc_per_node N -m megatron_endprompt.training.pretrain ARGS``; returns
    ``(exit code, log text)``; the log also goes to ``log_path``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--master_port", str(free_port()),
           "-m", "megatron_endprompt.training.pretrain", *args]
    env = {**os.environ, "CUDA_DEVICE_MAX_CONNECTIONS": "1", "OMP_NUM_THREADS": "1"}
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    with open(log_path) as f:
        return proc.returncode, f.read()


def train_tiny(*, workdir: str, tokenizer_model: str, data_prefixes: list[str],
               seq_length: int, target_length: int, train_iters: int, parallel: str = "tp2",
               extra: list[str] | None = None, nproc: int = 2) -> dict[int, float]:
    """Run the demo training; returns the logged loss per iteration. Raises on failure."""
    ckpt = os.path.join(workdir, "checkpoints")
    shutil.rmtree(ckpt, ignore_errors=True)  # a fresh run each time, never a stale resume
    args = [
        *TINY_LLAMA, *PARALLEL[parallel],
        "--seq-length", str(seq_length), "--max-position-embeddings", str(seq_length),
        "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", tokenizer_model,
        "--data-path", *data_prefixes, "--split", "90,5,5",
        "--data-cache-path", os.path.join(workdir, "index_cache"),
        "--endprompt-target-length", str(target_length),
        "--micro-batch-size", "4", "--global-batch-size", "8",
        "--train-iters", str(train_iters), "--lr", "3e-3", "--min-lr", "3e-4",
        "--lr-decay-style", "cosine", "--lr-warmup-iters", "2", "--weight-decay", "0.01",
        "--clip-grad", "1.0", "--seed", "1234", "--calculate-per-token-loss",
        "--log-interval", "5", "--eval-interval", str(train_iters), "--eval-iters", "2",
        "--num-workers", "0", "--save", ckpt, "--save-interval", str(train_iters),
        "--ckpt-format", "torch_dist", *(extra or []),
    ]
    log_path = os.path.join(workdir, "train.log")
    print(f"\n$ torchrun --nproc_per_node {nproc} -m megatron_endprompt.training.pretrain "
          f"... ({parallel}, {train_iters} iterations; log: {log_path})", flush=True)
    rc, text = run_pretrain(args, log_path=log_path, nproc=nproc)
    losses = parse_losses(text)
    for it, loss in sorted(losses.items()):
        print(f"  iteration {it:4d}  lm loss {loss:.4f}")
    if rc != 0 or not losses:
        tail = "\n".join(text.splitlines()[-15:])
        raise SystemExit(f"error: demo training failed (exit {rc}); last lines of "
                         f"{log_path}:\n{tail}")
    return losses
