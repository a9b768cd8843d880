"""Launch helpers: a free TCP port for ``torchrun``/gloo rendezvous, and a single-process
Megatron setup (gloo, world size 1, TP=PP=CP=1) for in-process work: checkpoint conversion,
benchmarks and unit tests that build a model without ``torchrun``. Nothing here patches torch
or Megatron (that is :mod:`megatron_endprompt.runtime`)."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

import torch

from megatron_endprompt import runtime


def free_port() -> int:
    """A TCP port on the loopback that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def single_process_group() -> Iterator[None]:
    """``torch.distributed`` (gloo, world size 1) and Megatron model parallel TP=PP=1 for the
    duration; reuses an existing world-size-1 setup and tears down only what it created."""
    from megatron.core import parallel_state

    created_pg = False
    if not torch.distributed.is_initialized():
        rendezvous = {"MASTER_PORT": str(free_port())}
        if "MASTER_ADDR" not in os.environ:
            rendezvous["MASTER_ADDR"] = "127.0.0.1"
        with runtime.scoped_env(**rendezvous):  # read by init only; the process keeps its env
            torch.distributed.init_process_group("gloo", rank=0, world_size=1)
        created_pg = True
    elif torch.distributed.get_world_size() != 1:
        raise RuntimeError("single_process_group needs world size 1 (run without torchrun)")
    created_mp = False
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
        created_mp = True
    try:
        yield
    finally:
        if created_mp:
            parallel_state.destroy_model_parallel()
        if created_pg:
            torch.distributed.destroy_process_group()
