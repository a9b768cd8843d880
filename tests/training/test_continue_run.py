"""Continuing a finished run with a larger ``--train-iters`` (megatron_endprompt.training
.schedule_check): one ``error:`` line at start-up naming the flag that continues it, instead of
Megatron's ``OptimizerParamScheduler`` assertion after every rank has loaded the checkpoint; with
that flag the run continues from the saved iteration. Demo-size model, CPU, one rank."""

from __future__ import annotations

import os

import pytest

from megatron_endprompt.data.prepare.motif_corpus import write_motif_prefix
from megatron_endprompt.demo_train import TINY_LLAMA, run_pretrain
from megatron_endprompt.training.loss import read_loss_log

pytestmark = pytest.mark.slow

P, L, VOCAB = 64, 512, 1000


def test_larger_train_iters_is_refused_at_start_up_with_the_flag(tmp_path):
    (tmp_path / "data").mkdir()
    prefix = write_motif_prefix(str(tmp_path / "data"), seq_length=P, target_length=L,
                                vocab=VOCAB, docs=60, placement="random")
    out = str(tmp_path / "out")

    def launch(name, iters, *extra):
        args = [*TINY_LLAMA, "--norm-epsilon", "1e-5", "--seq-length", str(P),
                "--max-position-embeddings", str(P), "--tokenizer-type", "NullTokenizer",
                "--vocab-size", str(VOCAB), "--data-path", prefix, "--split", "90,5,5",
                "--data-cache-path", str(tmp_path / "cache"), "--endprompt-target-length",
                str(L), "--micro-batch-size", "2", "--global-batch-size", "4",
                "--train-iters", str(iters), "--lr", "1e-3", "--lr-decay-style", "constant",
                "--seed", "1234", "--calculate-per-token-loss", "--log-interval", "1",
                "--eval-iters", "0", "--eval-interval", "1000", "--num-workers", "0",
                "--ckpt-format", "torch_dist", "--load", out, "--save", out,
                "--save-interval", "1000", "--endprompt-loss-log", str(tmp_path / name), *extra]
        return run_pretrain(args, log_path=str(tmp_path / f"{name}.log"), nproc=1)

    rc, log = launch("first", 2)
    assert rc == 0, log[-3000:]
    assert sorted(read_loss_log(str(tmp_path / "first"))) == [1, 2]

    rc, log = launch("more", 3)
    assert rc != 0  # the rank exits 2; torchrun reports the failed rank after it
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, log[-3000:]
    assert "--train-iters 3" in errors[0] and "--train-iters 2" in errors[0]
    assert "--override-opt_param-scheduler" in errors[0]
    assert "OptimizerParamScheduler:" not in log and "AssertionError" not in log
    assert "exitcode: 2" in log  # our start-up refusal, not an exception in Megatron
    assert not os.path.exists(tmp_path / "more")  # refused before training started

    rc, log = launch("continued", 3, "--override-opt_param-scheduler")
    assert rc == 0, log[-3000:]
    assert sorted(read_loss_log(str(tmp_path / "continued"))) == [3]
