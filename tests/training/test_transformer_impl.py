"""``--transformer-impl transformer_engine`` on a machine without CUDA is refused in one line before
Megatron starts (not a traceback from the model build), whether Transformer Engine is installed or
not: TE's modules cannot be built on a CPU (installed, a traceback from inside the model build;
absent, one from Megatron's TE layer spec)."""

from __future__ import annotations

import argparse
import importlib.util

import pytest
import torch

from megatron_endprompt.errors import UserError
from megatron_endprompt.training.checks import check_startup


def _args(**kw):
    return argparse.Namespace(make_vocab_size_divisible_by=128, endprompt_target_length=None,
                              data_path=None, load=None, **kw)


@pytest.fixture
def te_installed(monkeypatch):
    """``set(True|False)``: make ``transformer_engine`` look installed or absent to
    ``importlib.util.find_spec`` (the real package is absent here)."""
    real = importlib.util.find_spec

    def set_installed(present: bool) -> None:
        def find_spec(name, *a, **kw):
            if name == "transformer_engine":
                return importlib.machinery.ModuleSpec(name, None) if present else None
            return real(name, *a, **kw)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)

    return set_installed


@pytest.mark.parametrize("installed", [True, False])
def test_te_impl_without_cuda_is_refused(installed, te_installed, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    te_installed(installed)
    with pytest.raises(UserError) as err:
        check_startup(_args(transformer_impl="transformer_engine"))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("--transformer-impl transformer_engine needs a CUDA GPU")
    assert f"Transformer Engine is {'installed' if installed else 'not installed'}" in msg
    assert "--transformer-impl local" in msg


def test_local_impl_and_a_gpu_pass(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    check_startup(_args(transformer_impl="local"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_startup(_args(transformer_impl="transformer_engine"))
