"""Megatron-level half of the CPU runtime (installed only without CUDA).

Reviewed against Megatron-Core 0.18.2, 0.19.2 and main 0.20.0 (``megatron.core`` and
``megatron.training``). Each patched function's fingerprints are in :data:`FINGERPRINTS`; the
ledger refuses to patch a function whose code differs from every reviewed release (see
:mod:`megatron_endprompt.runtime.ledger`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from megatron_endprompt.runtime.ledger import Ledger

_PATCH = "cpu-megatron"

#: Fingerprints (:func:`~megatron_endprompt.runtime.ledger.fingerprint`) of the Megatron-Core
#: functions these patches wrap or replace, per reviewed release (0.20.0 = Megatron-LM main
#: d98e8a64); each release's diff was read against the patch.
FINGERPRINTS: dict[str, dict[str, str]] = {
    "initialize_megatron": {
        "0.18.2": "793a5c6258f9",
        "0.19.2": "353fb459b48b",
        "0.20.0": "180056f5128d",
    },
    "_get_cuda_rng_state": {"0.18.2, 0.19.2, 0.20.0": "fd0ec2c1c238"},
    "_set_cuda_rng_state": {"0.18.2, 0.19.2, 0.20.0": "66d4d8e996ca"},
    "load_checkpoint": {
        "0.18.2": "0a0a8bbeb224",
        "0.19.2": "ae6bc340b780",
        "0.20.0": "e44560227b03",
    },
    "_warmup_jit_function": {
        "0.18.2": "105152d47917",
        "0.19.2, 0.20.0": "8430b80612b6",
    },
    "train": {
        "0.18.2": "efc4ce2ad990",
        "0.19.2": "78022ba81583",
        "0.20.0": "3b8f329b8c42",
    },
    "get_write_results_queue": {"0.18.2, 0.19.2, 0.20.0": "53bba88681da"},
}


# ----------------------------------------------------------------------------------------------
# CPU-only patches
# ----------------------------------------------------------------------------------------------

def patch_initialize_megatron(ledger: Ledger) -> None:
    """Call ``initialize_megatron`` with ``allow_no_cuda=True``.

    ``pretrain()`` calls it without arguments, and its first line asserts
    ``torch.cuda.is_available()``; everything after that works on CPU with gloo.
    """
    import megatron.training as mt
    import megatron.training.initialize as mt_init
    import megatron.training.training as mt_training

    original = ledger.check(mt_init, "initialize_megatron", FINGERPRINTS["initialize_megatron"],
                            patch=_PATCH)

    @functools.wraps(original)
    def initialize_megatron(*args: Any, **kwargs: Any) -> Any:
        if not args:
            kwargs["allow_no_cuda"] = True
        return original(*args, **kwargs)

    for module in (mt_init, mt_training, mt):
        ledger.replace(module, "initialize_megatron", initialize_megatron, patch=_PATCH)


def patch_rng_state_functions(ledger: Ledger) -> None:
    """Make Megatron's ``_get/_set_cuda_rng_state`` use the CPU generator.

    The stock versions reach for ``torch.cuda.default_generators`` (empty without CUDA)
    through ``torch.cuda._lazy_call``, which silently queues the call forever when CUDA
    never initialises; the RNG tracker would then never actually switch states.
    """
    import megatron.core.tensor_parallel.random as mp_random

    def _get_cuda_rng_state(device: Any = "cuda", clone: bool = False,
                            graph_safe: bool = False) -> torch.Tensor:
        """CPU generator state (Megatron's "CUDA" RNG on the CPU runtime)."""
        return torch.get_rng_state()

    def _set_cuda_rng_state(new_state: torch.Tensor, device: Any = -1,
                            graph_safe: bool = False) -> None:
        """Set the CPU generator state (Megatron's "CUDA" RNG on the CPU runtime)."""
        torch.set_rng_state(new_state)

    for fn in (_get_cuda_rng_state, _set_cuda_rng_state):
        ledger.replace(mp_random, fn.__name__, fn, patch=_PATCH,
                       expected=FINGERPRINTS[fn.__name__])


class _SharedGeneratorWarningFilter(logging.Filter):
    """Drop the RNG tracker's "CPU RNG state changed within GPU RNG context" warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "CPU RNG state changed within GPU RNG context" not in record.getMessage()


def patch_rng_tracker_warning(ledger: Ledger) -> None:
    """Silence the tracker's CPU-RNG-changed warning: on CPU both RNGs are one generator.

    ``CudaRNGStatesTracker.fork`` warns when the CPU generator moves inside a forked
    "CUDA" RNG region; with the CPU runtime, dropout inside the region *is* the CPU
    generator moving, so the warning would fire on every forward pass.
    """
    logger = logging.getLogger("megatron.core.tensor_parallel.random")
    ledger.remember(logger, "filters", patch=_PATCH)
    logger.addFilter(_SharedGeneratorWarningFilter())


def patch_resume_rng_at_train_start(ledger: Ledger) -> None:
    """On resume, re-apply the checkpoint's RNG state when ``train()`` starts.

    On a GPU, dropout draws from the CUDA generator, which nothing touches between
    ``load_checkpoint`` and the first training step. On the CPU runtime dropout shares the
    CPU generator with the data pipeline, and ``pretrain()`` builds the data iterators
    *after* loading (a ``DataLoader`` iterator draws its base seed from the default
    generator), so a resumed run would drop out different units than the uninterrupted
    one. Remembering the generator state right after the load and restoring it at the
    start of ``train()`` makes a resumed run reproduce the uninterrupted one exactly.
    """
    import megatron.training.training as mt_training

    original_load = ledger.check(mt_training, "load_checkpoint", FINGERPRINTS["load_checkpoint"],
                                 patch=_PATCH)
    original_train = ledger.check(mt_training, "train", FINGERPRINTS["train"], patch=_PATCH)
    ledger.check(mt_training, "get_args", None, patch=_PATCH)  # called by the wrapper below
    loaded_state: dict[str, torch.Tensor] = {}

    @functools.wraps(original_load)
    def load_checkpoint(*args: Any, **kwargs: Any) -> Any:
        result = original_load(*args, **kwargs)
        margs = mt_training.get_args()
        iteration = result[0] if isinstance(result, tuple) else 0
        if iteration and not (margs.no_load_rng or margs.finetune):
            loaded_state["generator"] = torch.default_generator.get_state()
        return result

    @functools.wraps(original_train)
    def train(*args: Any, **kwargs: Any) -> Any:
        state = loaded_state.pop("generator", None)
        if state is not None:
            torch.default_generator.set_state(state)
        return original_train(*args, **kwargs)

    ledger.replace(mt_training, "load_checkpoint", load_checkpoint, patch=_PATCH)
    ledger.replace(mt_training, "train", train, patch=_PATCH)


def patch_jit_warmup_rng(ledger: Ledger) -> None:
    """Keep the CPU generator where it was across Megatron's JIT warm-up.

    ``pretrain()`` warms its fused bias/activation functions on ``torch.rand`` tensors of this
    layout's shape (``seq_length / CP``, ``/ TP`` under sequence parallelism) before it builds
    the model. On a GPU they draw from the CUDA generator, and ``--use-cpu-initialization``
    initialises the weights from the untouched CPU generator, so every TP/CP layout starts from
    the same weights. On the CPU runtime the two generators are one: without this, a CP=2 run
    would start from other weights than the CP=1 run of the same seed.
    """
    import megatron.training.initialize as mt_init

    original = ledger.check(mt_init, "_warmup_jit_function",
                            FINGERPRINTS["_warmup_jit_function"], patch=_PATCH)

    @functools.wraps(original)
    def _warmup_jit_function(*args: Any, **kwargs: Any) -> Any:
        state = torch.get_rng_state()
        try:
            return original(*args, **kwargs)
        finally:
            torch.set_rng_state(state)

    ledger.replace(mt_init, "_warmup_jit_function", _warmup_jit_function, patch=_PATCH)


def patch_checkpoint_results_queue(ledger: Ledger) -> None:
    """Start the ``torch_dist`` save's results queue in a forked, not a spawned, process.

    A rank's first ``torch_dist`` save creates a ``multiprocessing`` manager whose queue
    carries the write results (torch ``WriteResult`` objects) back to the saving rank.
    Megatron starts it with the ``spawn`` context: a fresh interpreter that imports torch to
    unpickle the first result, ~2.4 s on every saving rank of every launch (a one-rank,
    one-iteration run with a save: 15.0 -> 12.7 CPU-s on 2 cores). Forked, the manager has
    the rank's modules already; it touches no tensor and no device (Megatron's own
    ``--async-save`` forks the training process too). Only the CPU layer changes the context.
    """
    import megatron.core.dist_checkpointing.strategies.filesystem_async as fs_async

    original = ledger.check(fs_async, "get_write_results_queue",
                            FINGERPRINTS["get_write_results_queue"], patch=_PATCH)

    @functools.wraps(original)
    def get_write_results_queue(mp_mode: str = "fork") -> Any:
        return original(mp_mode=mp_mode)

    ledger.replace(fs_async, "get_write_results_queue", get_write_results_queue, patch=_PATCH)


def install_megatron_cpu_patches(ledger: Ledger) -> None:
    """Apply every Megatron-level CPU patch."""
    patch_initialize_megatron(ledger)
    patch_rng_state_functions(ledger)
    patch_rng_tracker_warning(ledger)
    patch_resume_rng_at_train_start(ledger)
    patch_jit_warmup_rng(ledger)
    patch_checkpoint_results_queue(ledger)
