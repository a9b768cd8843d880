"""``--transformer-impl transformer_engine`` on a machine without CUDA: one ``error:`` line before
anything is built (Transformer Engine's layers cannot run there, installed or not)."""

from __future__ import annotations

import pytest
import torch

from megatron_endprompt.demo_train import run_pretrain
from motif_data import write_motif_prefix

P, L, VOCAB = 64, 512, 1000


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU runtime (no CUDA)")
@pytest.mark.parametrize("form", [["--transformer-impl", "transformer_engine"],
                                  ["--transformer-impl=transformer_engine"]])
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
    rc, log = run_pretrain(args, log_path=str(tmp_path / "te.log"), nproc=1)
    assert rc != 0
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--transformer-impl transformer_engine needs a CUDA GPU" \
        in errors[0], log[-3000:]
    assert "Traceback" not in log and "iteration" not in log
