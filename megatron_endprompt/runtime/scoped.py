"""Patches that hold only for the duration of a ``with`` block, for in-process work on CPU
tensors without the whole CPU layer (checkpoint conversion, unit tests building a model).

Both go through a :class:`~megatron_endprompt.runtime.ledger.Ledger` restored on exit,
exceptions included.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from megatron_endprompt.runtime.ledger import Ledger

__all__ = ["cpu_checkpoint_io", "cpu_forward"]


def _synchronize(device: Any = None) -> None:
    """No CUDA device: nothing to synchronise."""


def _current_device_cpu() -> str:
    """Tensors Megatron puts on the "current device" go to the CPU."""
    return "cpu"


@contextlib.contextmanager
def cpu_checkpoint_io() -> Iterator[None]:
    """Let ``dist_checkpointing.save/load`` run in a process without CUDA.

    0.19's filesystem writer calls ``torch.cuda.synchronize()`` before copying tensors to the
    host and allocates its failure flag on ``torch.cuda.current_device()``, unconditionally;
    without a driver both raise. When CUDA is unavailable they become a no-op and ``"cpu"``
    for the duration (every tensor is on the CPU); with CUDA nothing changes.
    """
    import torch

    ledger = Ledger()
    try:
        if not torch.cuda.is_available():
            ledger.replace(torch.cuda, "synchronize", _synchronize, patch="cpu-checkpoint-io")
            ledger.replace(torch.cuda, "current_device", _current_device_cpu,
                           patch="cpu-checkpoint-io")
        yield
    finally:
        ledger.restore()


@contextlib.contextmanager
def cpu_forward() -> Iterator[None]:
    """Run a CPU-initialised Megatron model's forward in this process (model on the CPU).

    * stock ``RotaryEmbedding.get_emb`` moves ``inv_freq`` to ``torch.cuda.current_device()``:
      it points at the CPU for the duration;
    * local core attention forks the model-parallel CUDA RNG tracker (dropout): the fork is a
      no-op (callers use dropout 0). Needs Megatron's model parallel state initialised.
    """
    import torch
    from megatron.core import tensor_parallel

    ledger = Ledger()
    tracker = tensor_parallel.get_cuda_rng_tracker()

    def fork(*args: Any, **kwargs: Any) -> contextlib.AbstractContextManager:
        """No RNG state to switch for a CPU forward without dropout."""
        return contextlib.nullcontext()

    try:
        ledger.replace(torch.cuda, "current_device", _current_device_cpu, patch="cpu-forward")
        ledger.replace(tracker, "fork", fork, patch="cpu-forward", must_exist=False)
        yield
    finally:
        ledger.restore()
