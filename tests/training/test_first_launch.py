"""``--load OUT --save OUT`` with an empty (or not yet created) OUT is a first launch, from
``--pretrained-checkpoint`` or from scratch, and must not be refused; a ``--load`` that is not
the save directory and holds no checkpoint still is (a typo would train from scratch)."""

from __future__ import annotations

import argparse

import pytest

from megatron_endprompt.errors import UserError
from megatron_endprompt.training.checks import check_startup


def _args(**kw):
    return argparse.Namespace(make_vocab_size_divisible_by=128, endprompt_target_length=None,
                              data_path=None, pretrained_checkpoint=None, finetune=False, **kw)


def test_from_scratch_first_launch_is_accepted(tmp_path):
    out = tmp_path / "out"
    check_startup(_args(load=str(out), save=str(out)))  # not created yet
    out.mkdir()
    check_startup(_args(load=str(out), save=str(out)))  # created, empty


def test_load_other_than_save_without_checkpoint_is_refused(tmp_path):
    with pytest.raises(UserError, match="Megatron would train from scratch"):
        check_startup(_args(load=str(tmp_path / "typo"), save=str(tmp_path / "out")))
