"""Fixtures for the model tests: a single-process gloo Megatron and the runtime's scoped CPU
forward."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def megatron_parallel():
    """``torch.distributed`` (gloo, world size 1) and Megatron model parallel (TP=PP=CP=1).
    Reuses an existing initialisation; tears down only what it created."""
    from megatron.core import parallel_state

    from megatron_endprompt.launch import single_process_group

    with single_process_group():
        yield parallel_state


@pytest.fixture
def cpu_forward(megatron_parallel):
    """Let a CPU-initialised GPTModel run forward without a GPU, through the runtime's scoped
    :func:`~megatron_endprompt.runtime.cpu_forward` (``current_device`` -> CPU, no-op RNG
    tracker fork; dropout is 0 here)."""
    from megatron_endprompt.runtime import cpu_forward as scoped

    with scoped():
        yield megatron_parallel
