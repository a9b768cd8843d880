"""CP=2 against CP=1 on GPUs: Transformer Engine's context-parallel attention and fused RoPE with
EndPrompt positions (needs a machine with >= 2 CUDA GPUs and Transformer Engine; not run yet).

    python -m benchmarks.gpu.cp_check [--out-dir DIR] [--iters 10] [--dry-run]

The CPU suite pins CP=2 to CP=1 with the CPU runtime's all-gather attention
(``tests/training/test_context_parallel_pins.py``); what only a GPU runs is TE's ring attention
(``TEDotProductAttention`` with ``cp_comm_type p2p``) and its fused RoPE under CP. Two prefixes:
``fixed`` (every micro-batch shares one layout: ``[S,1,1,D]`` freqs into TE's fused kernel) and
``random`` (rows differ: ``[S,B,1,D]`` through the runtime's router). For each, the same seed,
data and weights are trained ``--iters`` iterations at CP=1 (one GPU) and CP=2 (two GPUs, DP=1
both), bf16, TE spec; the exact per-iteration losses (``--endprompt-loss-log``) must agree
within ``--rtol`` (bf16 and a different attention kernel split: 2e-2 by default). One JSON:
``DIR/cp_check.json`` (``$OUT`` or ``benchmarks/out``), one log per run beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

P, L, VOCAB = 1024, 8192, 1000

MODEL = ["--num-layers", "4", "--hidden-size", "256", "--ffn-hidden-size", "688",
         "--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "4",
         "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
         "--disable-bias-linear", "--untie-embeddings-and-output-weights",
         "--attention-dropout", "0", "--hidden-dropout", "0", "--seq-length", str(P),
         "--max-position-embeddings", str(P), "--tokenizer-type", "NullTokenizer",
         "--vocab-size", str(VOCAB)]


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def _prefix(root: str, placement: str) -> str:
    from megatron_endprompt.data.prepare.motif_corpus import write_motif_prefix

    os.makedirs(os.path.join(root, placement), exist_ok=True)
    return write_motif_prefix(os.path.join(root, placement), seq_length=P, target_length=L,
                              vocab=VOCAB, docs=400, placement=placement,
                              terminal_loss_weight=0.1)


def _command(prefix: str, out: str, name: str, cp: int, iters: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(cp),
            "--master_port", str(29400 + cp), "-m", "megatron_endprompt.training.pretrain",
            *MODEL, "--data-path", prefix, "--split", "90,5,5",
            "--data-cache-path", os.path.join(out, "cache"), "--endprompt-target-length", str(L),
            "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", str(iters),
            "--lr", "1e-3", "--min-lr", "1e-3", "--lr-decay-style", "constant",
            "--clip-grad", "1.0", "--seed", "1234", "--bf16", "--calculate-per-token-loss",
            "--transformer-impl", "transformer_engine", "--context-parallel-size", str(cp),
            "--cp-comm-type", "p2p", "--log-interval", "1", "--eval-iters", "1",
            "--eval-interval", "1000", "--num-workers", "0",
            "--endprompt-loss-log", os.path.join(out, f"{name}_losses")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default=os.environ.get("OUT") or "benchmarks/out")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--rtol", type=float, default=2e-2)
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    out = os.path.join(a.out_dir, "cp_check")
    os.makedirs(out, exist_ok=True)
    result: dict = {"gpus": _gpus(), "rtol": a.rtol, "runs": {}, "status": "planned"}
    if not a.dry_run and result["gpus"] < 2:
        result["status"] = "skipped: needs >= 2 CUDA GPUs"
    for placement in ("fixed", "random"):
        prefix = _prefix(out, placement)
        losses = {}
        for cp in (1, 2):
            name = f"{placement}_cp{cp}"
            cmd = _command(prefix, out, name, cp, a.iters)
            run = result["runs"].setdefault(name, {"command": shlex.join(cmd)})
            if a.dry_run or result["status"].startswith("skipped"):
                continue
            with open(os.path.join(out, f"{name}.log"), "w") as log:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "CUDA_DEVICE_MAX_CONNECTIONS": "1"},
                                    timeout=600).returncode
            from megatron_endprompt.training.loss import read_loss_log

            run["rc"] = rc
            losses[cp] = run["lm_loss"] = read_loss_log(os.path.join(out, f"{name}_losses"))
        if len(losses) == 2 and losses[1] and losses[2]:
            worst = max(abs(losses[2][i] - losses[1][i]) / abs(losses[1][i]) for i in losses[1])
            result["runs"][f"{placement}_cp2"]["max_rel_diff"] = worst
    diffs = [r.get("max_rel_diff") for r in result["runs"].values() if "max_rel_diff" in r]
    if diffs and len(diffs) == 2:
        result["status"] = "ok" if max(diffs) <= a.rtol else "mismatch"
    with open(os.path.join(out, "cp_check.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return 0 if result["status"] in ("ok", "planned") or result["status"].startswith("skipped") \
        else 1


if __name__ == "__main__":
    sys.exit(main())
