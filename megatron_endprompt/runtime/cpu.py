"""Run Megatron-Core's real trainer on a machine without a GPU.

:func:`install_cpu_runtime` is called once at process start (before Megatron builds
anything). On a machine with CUDA it does nothing. Otherwise it installs

* the PyTorch layer (:mod:`megatron_endprompt.runtime.cpu_torch`): a torch function mode
  that rewrites CUDA device arguments to CPU in every thread, ``Tensor.cuda()`` as identity,
  ``Tensor.type()`` with CUDA names for Megatron, and ``torch.cuda`` stand-ins;
* the Megatron layer (:mod:`megatron_endprompt.runtime.cpu_megatron`): ``allow_no_cuda``,
  RNG state on the CPU generator, and the wheel fixes (dataset helpers, distributed
  optimizer resume with the torch-Adam fallback).

Runs then need ``--distributed-backend gloo --transformer-impl local
--use-cpu-initialization`` and the ``--no-*-fusion`` flags listed in :data:`CPU_ARGS`.
"""

from __future__ import annotations

import os
import sys

import torch

#: Megatron command-line flags a CPU run needs (no Transformer Engine, no CUDA fusions).
CPU_ARGS: tuple[str, ...] = (
    "--distributed-backend", "gloo",
    "--transformer-impl", "local",
    "--use-cpu-initialization",
    "--no-rope-fusion",
    "--no-gradient-accumulation-fusion",
    "--no-masked-softmax-fusion",
    "--no-bias-swiglu-fusion",
    "--no-bias-dropout-fusion",
    "--no-persist-layer-norm",
)

_INSTALLED = False


def is_installed() -> bool:
    """Whether :func:`install_cpu_runtime` has patched this process."""
    return _INSTALLED


def install_cpu_runtime(force: bool = False) -> bool:
    """Install the CPU runtime once per process.

    Args:
        force: install even though ``torch.cuda.is_available()`` is True (tests only).

    Returns:
        True if the runtime is installed in this process (now or by an earlier call),
        False if CUDA is available and nothing was patched.

    Raises:
        RuntimeError: the installed Megatron-Core is not a version the patches were written for.
    """
    global _INSTALLED
    if _INSTALLED:
        return True
    if torch.cuda.is_available() and not force:
        return False

    from megatron_endprompt.runtime.cpu_megatron import (
        check_megatron_version,
        install_megatron_cpu_patches,
        install_wheel_fixes,
    )
    from megatron_endprompt.runtime.cpu_torch import install_torch_patches

    version = check_megatron_version()
    # Megatron requires this for TP>1 (it orders kernel launches on one CUDA queue); on CPU
    # it changes nothing but silences the check.
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    install_torch_patches()
    install_megatron_cpu_patches()
    install_wheel_fixes()
    _INSTALLED = True
    print(
        f"megatron_endprompt: no CUDA device, running Megatron-Core {version} on CPU "
        "(megatron_endprompt.runtime.cpu)",
        file=sys.stderr,
        flush=True,
    )
    return True
