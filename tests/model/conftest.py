"""Fixtures for the model tests: a single-process gloo Megatron and CPU stand-ins for the two
CUDA calls the tiny model's forward makes."""

from __future__ import annotations

import contextlib
import os
import socket

import pytest
import torch


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def megatron_parallel():
    """``torch.distributed`` (gloo, world size 1) and Megatron model parallel (TP=PP=CP=1).
    Reuses an existing initialisation; tears down only what it created."""
    from megatron.core import parallel_state

    created_pg = False
    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(_free_port())
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
        created_pg = True
    created_mp = False
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
        created_mp = True
    yield parallel_state
    if created_mp:
        parallel_state.destroy_model_parallel()
    if created_pg:
        torch.distributed.destroy_process_group()


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
