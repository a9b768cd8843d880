"""Megatron's console and TensorBoard show each iteration's true loss (megatron_endprompt.runtime
.log_sums): with ``--log-interval 1`` (the launcher's default) Megatron-Core printed the mean of
iterations 1 and 2 as iteration 2's loss, because it does not reset its sums after a launch's
first log line. Checked against the exact per-iteration losses of ``--endprompt-loss-log``, on
the demo-size model, CPU, one rank, from scratch."""

from __future__ import annotations

import glob

import pytest

from megatron_endprompt.data.prepare.motif_corpus import write_motif_prefix
from megatron_endprompt.demo_train import TINY_LLAMA, parse_losses, run_pretrain
from megatron_endprompt.training.loss import read_loss_log

pytestmark = pytest.mark.slow

P, L, VOCAB = 64, 512, 1000


def _tensorboard_losses(logdir: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = glob.glob(f"{logdir}/events.out.tfevents.*")
    acc = EventAccumulator(events, size_guidance={"scalars": 0})
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars("lm loss")}


def test_console_and_tensorboard_losses_are_per_iteration(tmp_path):
    (tmp_path / "data").mkdir()
    prefix = write_motif_prefix(str(tmp_path / "data"), seq_length=P, target_length=L,
                                vocab=VOCAB, docs=60, placement="random")
    tb, losses = str(tmp_path / "tb"), str(tmp_path / "losses")
    args = [*TINY_LLAMA, "--norm-epsilon", "1e-5", "--seq-length", str(P),
            "--max-position-embeddings", str(P), "--tokenizer-type", "NullTokenizer",
            "--vocab-size", str(VOCAB), "--data-path", prefix, "--split", "90,5,5",
            "--data-cache-path", str(tmp_path / "cache"), "--endprompt-target-length", str(L),
            "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "4",
            "--lr", "1e-2", "--lr-decay-style", "constant", "--seed", "1234",
            "--calculate-per-token-loss", "--log-interval", "1", "--eval-iters", "0",
            "--eval-interval", "1000", "--num-workers", "0", "--tensorboard-dir", tb,
            "--endprompt-loss-log", losses]
    rc, log = run_pretrain(args, log_path=str(tmp_path / "train.log"), nproc=1)
    assert rc == 0, log[-3000:]
    exact = read_loss_log(losses)
    console = parse_losses(log)
    board = _tensorboard_losses(tb)
    assert sorted(exact) == sorted(console) == sorted(board) == [1, 2, 3, 4]
    # the losses differ from one iteration to the next (lr 1e-2), so a mean of two shows
    assert abs(exact[2] - exact[1]) > 1e-3
    for it in exact:  # console: 6 significant digits (%.6E); TensorBoard: float32
        assert console[it] == pytest.approx(exact[it], rel=2e-6), (it, console, exact)
        assert board[it] == pytest.approx(exact[it], rel=1e-6), (it, board, exact)
