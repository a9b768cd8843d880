"""Fixtures of the planner tests: tiny CPU models built the way
``benchmarks/step_time/models.py`` builds them (local spec, fp32), on a single-process gloo
Megatron."""

from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks.step_time import measure as step_time_measure
from benchmarks.step_time import models as step_time_models


@pytest.fixture(scope="module")
def bench_modules():
    """``(step_time_models, step_time_measure)``: ``benchmarks.step_time.models`` and
    ``benchmarks.step_time.measure``."""
    return step_time_models, step_time_measure


@pytest.fixture(scope="module")
def tiny_cpu(bench_modules):
    """``build(groups, tied) -> (args, EndPromptGPTModel)``: the benchmark's model (local spec,
    fp32) on CPU, its forward run through the runtime's scoped
    :func:`~megatron_endprompt.runtime.cpu_forward` (as ``tests/model/conftest.py`` does) for the
    module's duration."""
    from megatron_endprompt import runtime
    from megatron_endprompt.launch import single_process_group
    from megatron_endprompt.runtime import cpu_forward

    runtime.quiet()
    models, _ = bench_modules
    with single_process_group(), cpu_forward():

        def build(groups: int, tied: bool):
            args = argparse.Namespace(device="cpu", layers=2, hidden=128, heads=4, groups=groups,
                                      ffn=512, vocab=1024, tie_embeddings=tied, seq_length=64,
                                      ratio=4, seed=3, micro_batch=2)
            with torch.random.fork_rng():  # build_models seeds torch's global generator
                stock, ours = models.build_models(args)
            del stock
            return args, ours

        yield build
