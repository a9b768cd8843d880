"""``--endprompt-target-length``'s bound: the window's own int32 limit, checked by the start-up
checks where the run builder first reads ``L`` (before any checkpoint or data is read)."""

from __future__ import annotations

import argparse

import pytest

from megatron_endprompt.errors import UserError
from megatron_endprompt.training.checks import check_target_length
from megatron_endprompt.training.run import long_eval_settings
from megatron_endprompt.window import MAX_POSITION, EndPromptWindow


def test_the_bound_is_the_windows():
    check_target_length(MAX_POSITION)
    EndPromptWindow(target_length=MAX_POSITION, seq_length=8, original_length=8)
    with pytest.raises(UserError, match=rf"\[1, {MAX_POSITION}\]"):
        check_target_length(MAX_POSITION + 1)
    with pytest.raises(ValueError, match="int32"):
        EndPromptWindow(target_length=MAX_POSITION + 1, seq_length=8, original_length=8)


@pytest.mark.parametrize("L", [0, -4, 2**31])
def test_the_first_read_of_L_refuses_it_in_one_line(L):
    args = argparse.Namespace(endprompt_target_length=L, endprompt_long_eval_interval=0)
    with pytest.raises(UserError) as err:
        long_eval_settings(args)
    assert "--endprompt-target-length" in str(err.value) and "\n" not in str(err.value)
