"""``--transformer-impl transformer_engine`` on a machine without CUDA: one ``error:`` line before
anything is built (Transformer Engine's layers cannot run there, installed or not). Old code:
a traceback from the model provider (``TypeError: 'NoneType' object is not callable``, TE's
layer classes being ``None`` without TE)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from megatron_endprompt.data.prepare.motif_corpus import write_motif_prefix

from megatron_endprompt.launch import free_port

P, L, VOCAB = 64, 512, 1000


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU runtime (no CUDA)")
@pytest.mark.parametrize("form", [
    ["--transformer-impl", "transformer_engine"],
    ["--transformer-impl=local", "--transformer-impl=transformer_engine"],  # the last one wins
])
def test_te_impl_without_cuda_is_refused_in_one_line(tmp_path, form):
    prefix = write_motif_prefix(str(tmp_path), seq_length=P, target_length=L, vocab=VOCAB,
                                placement="random", pose_chunks=2, terminal_loss_weight=0.3)
    args = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
            "--position-embedding-type", "rope", "--normalization", "RMSNorm",
            "--seq-length", str(P), "--max-position-embeddings", str(P),
            "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB),
            "--data-path", prefix, "--split", "90,5,5", "--endprompt-target-length", str(L),
            "--micro-batch-size", "2", "--global-batch-size", "2", "--lr", "1e-3",
            "--train-iters", "1", "--calculate-per-token-loss", "--eval-iters", "0",
            "--data-cache-path", str(tmp_path / "cache"), *form]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"}
    # one process as torchrun would start it (torchrun itself adds its own traceback on failure)
    proc = subprocess.run([sys.executable, "-m", "megatron_endprompt.training.pretrain", *args],
                          capture_output=True, text=True, timeout=600, env=env, check=False)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and "--transformer-impl transformer_engine needs a CUDA GPU" \
        in errors[0], proc.stderr[-3000:]
    assert lines[-1] == errors[0]
    assert "Traceback" not in proc.stderr and "iteration" not in proc.stdout
