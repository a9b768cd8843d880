"""The CPU layer: run Megatron-Core's real trainer on a machine without a GPU.

Installed by ``runtime.install()`` only when ``torch.cuda.is_available()`` is False:

* the PyTorch layer (:mod:`megatron_endprompt.runtime.cpu_torch`): a torch function mode
  that rewrites CUDA device arguments to CPU in every thread, ``Tensor.cuda()`` as identity,
  ``Tensor.type()`` with CUDA names for Megatron, and ``torch.cuda`` stand-ins;
* the Megatron layer (:mod:`megatron_endprompt.runtime.cpu_megatron`): ``allow_no_cuda``,
  RNG state on the CPU generator, resume RNG at train start;
* the context-parallel core attention (:mod:`megatron_endprompt.runtime.cp_attention`): the
  local layer spec's attention, stock at CP == 1, exact all-gather attention at CP > 1.

Runs then need the flags of :data:`CPU_ARGS` (gloo, the local layer spec, no CUDA fusions);
the pretrain entry adds the ones the user did not set.
"""

from __future__ import annotations

import importlib
import sys

from megatron_endprompt.runtime.ledger import Ledger
from megatron_endprompt.runtime.process import set_env_default

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


def with_cpu_args(argv: list[str]) -> list[str]:
    """``argv`` with the :data:`CPU_ARGS` the user did not set prepended (a flag the user gave,
    with or without ``=value``, is kept as given)."""
    present = set(a.split("=")[0] for a in argv if a.startswith("--"))
    extra: list[str] = []
    i = 0
    while i < len(CPU_ARGS):
        flag = CPU_ARGS[i]
        takes_value = i + 1 < len(CPU_ARGS) and not CPU_ARGS[i + 1].startswith("--")
        if flag not in present:
            extra += CPU_ARGS[i:i + 1 + takes_value]
        i += 1 + takes_value
    return extra + list(argv)


def install_cpu_layer(ledger: Ledger) -> None:
    """Apply the torch and Megatron CPU patches through ``ledger``."""
    # These modules import torch and Megatron, which the runtime's callers load later:
    # lazy: spares Megatron
    from megatron_endprompt.runtime.cp_attention import install_cp_attention
    # lazy: spares Megatron
    from megatron_endprompt.runtime.cpu_megatron import install_megatron_cpu_patches
    # lazy: spares torch
    from megatron_endprompt.runtime.cpu_torch import install_torch_patches

    # Megatron requires this for TP>1 (it orders kernel launches on one CUDA queue); on CPU
    # it changes nothing but silences the check.
    set_env_default(ledger, "CUDA_DEVICE_MAX_CONNECTIONS", "1", patch="cpu-env")
    install_torch_patches(ledger)
    install_megatron_cpu_patches(ledger)
    install_cp_attention(ledger)


#: What a CPU training rank imports of Megatron (its ``pretrain``, the GPT model, the trainer's
#: loop) while :func:`import_megatron_eager` holds ``torch.compile`` back.
EAGER_IMPORTS = ("megatron.training", "megatron.training.training", "megatron.core.models.gpt")


def import_megatron_eager(modules: tuple[str, ...] = EAGER_IMPORTS) -> bool:
    """Import ``modules`` (Megatron's, or ours that import it) with ``torch.compile`` the
    identity for the duration, then put it back. Megatron decorates its fused element-wise
    functions with ``torch.compile`` at import time (``megatron.core.jit.jit_fuser``), which
    imports torch's dynamo and inductor: ~2-3 s of every CPU process's start-up, for functions
    that :data:`CPU_ARGS` keeps off (the bias-SwiGLU/GELU and bias-dropout fusions), that a
    Llama never calls (squared ReLU, the attention output gate, L2 norm) or that a conversion
    never runs; left eager, they compute the same. Only without CUDA (a GPU keeps Megatron's
    compiled fusions). Returns ``False`` when CUDA is present or Megatron-Core was imported
    already (its functions are decorated: nothing to do)."""
    import torch  # not at module level: the launcher's checks import this module torch-free

    if "megatron.core" in sys.modules or torch.cuda.is_available():
        return False
    compile_ = torch.compile

    def identity(model=None, **_options):
        return model if model is not None else (lambda fn: fn)

    torch.compile = identity
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        torch.compile = compile_
    return True
