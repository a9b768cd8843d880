"""``providers.make_forward_step`` in-process (gloo, world size 1): what reaches the model.

Defect 5: under ``--mtp-num-layers`` Megatron's MTP loss is computed inside ``GPTModel.forward``
from the ``loss_mask`` it is given (all ones when none is): the forward step must pass the
EndPrompt weights, and the last pipeline stage needs the tokens for the MTP embedding.
"""

from __future__ import annotations

import argparse

import pytest
import torch
from test_batch_ranks import make_batch

from megatron_endprompt.training.batch import get_batch
from megatron_endprompt.training.providers import make_forward_step
from megatron_endprompt.training.run import EndPromptRun
from megatron_endprompt.window import EndPromptWindow


class Recorder(torch.nn.Module):
    """Stands in for the (last-stage) model: records its call, returns token losses."""

    pre_process = post_process = True

    def forward(self, tokens, position_ids, attention_mask, **kwargs):
        self.call = dict(tokens=tokens, position_ids=position_ids, **kwargs)
        return torch.ones(position_ids.shape)


@pytest.fixture
def megatron_args():
    from megatron.training import global_vars

    from megatron_endprompt.launch import single_process_group

    saved = global_vars._GLOBAL_ARGS
    args = argparse.Namespace(micro_batch_size=2, seq_length=16,
                              create_attention_mask_in_dataloader=False, mtp_num_layers=None,
                              curr_iteration=0)
    with single_process_group():
        global_vars.set_args(args)
        try:
            yield args
        finally:
            global_vars.set_args(saved)


def test_forward_step_passes_the_weights_to_the_model(megatron_args):
    batch = make_batch()
    model = Recorder()
    forward_step = make_forward_step(EndPromptRun(window=EndPromptWindow(
        target_length=32, seq_length=16, original_length=16)))
    output, loss_fn = forward_step(iter([batch]), model)
    assert torch.equal(model.call["labels"], batch["labels"])
    assert "loss_mask" in model.call, "MTP would weight every token 1"
    assert torch.equal(model.call["loss_mask"], batch["loss_mask"])
    loss_sum, count, _ = loss_fn(output)
    assert count.item() == int((batch["loss_mask"] > 0).sum())


def test_last_stage_gets_tokens_only_under_mtp(megatron_args):
    last = get_batch(iter([make_batch()]), first_stage=False, last_stage=True)
    assert "tokens" not in last
    megatron_args.mtp_num_layers = 1
    last = get_batch(iter([make_batch()]), first_stage=False, last_stage=True)
    assert torch.equal(last["tokens"], make_batch()["tokens"])
