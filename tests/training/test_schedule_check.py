"""megatron_endprompt.training.schedule_check.check_warmup_fits: the pretrain entry's line for
a warm-up as long as the decay, which Megatron's ``OptimizerParamScheduler`` asserts against
only after every rank has built the model (the check is its condition, in samples)."""

from __future__ import annotations

import argparse

import pytest

from megatron_endprompt.errors import UserError
from megatron_endprompt.training.schedule_check import check_warmup_fits


def _args(**over) -> argparse.Namespace:
    values = {"train_iters": 4, "global_batch_size": 2, "lr_decay_iters": None,
              "lr_warmup_iters": 0, "lr_warmup_fraction": None}
    return argparse.Namespace(**{**values, **over})


@pytest.mark.parametrize("over, says", [
    ({"lr_warmup_iters": 20}, "--lr-warmup-iters 20 leaves no iteration after the warm-up "
                              "(--train-iters 4)"),
    ({"lr_warmup_iters": 4}, "--lr-warmup-iters 4"),
    ({"lr_warmup_iters": 8, "lr_decay_iters": 8}, "(--lr-decay-iters 8)"),
    ({"lr_warmup_fraction": 1.0}, "--lr-warmup-fraction 1.0"),
])
def test_warmup_as_long_as_the_decay_is_refused(over, says):
    with pytest.raises(UserError) as exc:
        check_warmup_fits(_args(**over))
    assert says in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("over", [{"lr_warmup_iters": 3}, {"lr_warmup_iters": 20,
                                                           "lr_decay_iters": 100},
                                  {"lr_warmup_fraction": 0.5}, {"train_iters": None}])
def test_warmup_shorter_than_the_decay_passes(over):
    check_warmup_fits(_args(**over))
