"""Fixtures for the model tests: a single-process gloo Megatron and CPU stand-ins for the two
CUDA calls the tiny model's forward makes."""

from __future__ import annotations

import contextlib

import pytest
import torch


@pytest.fixture(scope="session")
def megatron_parallel():
    """``torch.distributed`` (gloo, world size 1) and Megatron model parallel (TP=PP=CP=1).
    Reuses an existing initialisation; tears down only what it created."""
    from megatron.core import parallel_state

    from megatron_endprompt.runtime.process_group import single_process_group

    with single_process_group():
        yield parallel_state


@pytest.fixture
def cpu_forward(monkeypatch, megatron_parallel):
    """Let a CPU-initialised GPTModel run forward without a GPU.

    * stock ``RotaryEmbedding.get_emb`` moves ``inv_freq`` to ``torch.cuda.current_device()``:
      point it at the CPU;
    * local core attention forks the model-parallel CUDA RNG tracker (for dropout, 0 here):
      make the fork a no-op.
    """
    from megatron.core import tensor_parallel

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    tracker = tensor_parallel.get_cuda_rng_tracker()
    monkeypatch.setattr(tracker, "fork", lambda *a, **k: contextlib.nullcontext(), raising=False)
    return megatron_parallel
