"""A saved Megatron checkpoint back in a model in this process, for the tests that compare its
logits with an export's (or with another run's): find the iteration, open a one-process group
with the runtime's CPU forward, read the saved args, build, load the weights, run causally.

The caller builds the model (GPT, hybrid, with adapters...) from the saved args, so it can check
them first; the rest is the same for every caller.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["causal_logits", "checkpoint_model"]


@contextlib.contextmanager
def checkpoint_model(path: str, build: Callable[[Any], torch.nn.Module]
                     ) -> Iterator[torch.nn.Module]:
    """The model ``build(saved_args)`` makes, in eval mode, with the weights of the checkpoint at
    ``path`` (its directory or one iteration's) loaded (TP=PP=CP=1, CPU); usable only inside the
    ``with`` (the process group and the CPU forward end with it)."""
    # lazy: spares Megatron when the support package is imported
    from megatron_endprompt.conversion.megatron_ckpt import (
        find_checkpoint,
        load_common_state,
        load_model_weights,
        single_process_group,
    )
    from megatron_endprompt.runtime import cpu_forward

    ckpt = find_checkpoint(path)
    with single_process_group(), cpu_forward():
        model = build(load_common_state(ckpt)["args"]).eval()
        load_model_weights(model, ckpt)
        yield model


def causal_logits(model: torch.nn.Module, input_ids: torch.Tensor,
                  position_ids: torch.Tensor) -> torch.Tensor:
    """fp32 logits ``[B, S, V_padded]`` of ``input_ids`` ``[B, S]`` at ``position_ids``
    ``[B, S]`` under a causal mask, without autograd."""
    S = input_ids.shape[1]
    mask = torch.triu(torch.ones(1, 1, S, S, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        return model(input_ids, position_ids, mask).float()
