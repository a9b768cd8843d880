"""Megatron-level half of the CPU runtime, plus wheel fixes that GPU users need as well.

Written against Megatron-Core 0.19.x (``megatron.core`` and ``megatron.training`` of the
pip wheel); :func:`check_megatron_version` refuses other versions, because these patches
replace private functions whose behaviour moves between releases.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from megatron_endprompt.runtime.cpu_torch import PATCHED, replace_attribute

#: Megatron-Core ``major.minor`` versions these patches were written for and tested with.
SUPPORTED_MEGATRON_VERSIONS: tuple[str, ...] = ("0.19",)


def check_megatron_version() -> str:
    """Return Megatron-Core's version, or raise ``RuntimeError`` if the patches don't know it."""
    from megatron.core import package_info

    version = package_info.__version__
    if ".".join(version.split(".")[:2]) not in SUPPORTED_MEGATRON_VERSIONS:
        raise RuntimeError(
            f"megatron_endprompt.runtime: Megatron-Core {version} is not supported; the CPU "
            f"runtime and wheel fixes were written for {', '.join(v + '.x' for v in SUPPORTED_MEGATRON_VERSIONS)}. "
            "Install a supported megatron-core or update megatron_endprompt/runtime."
        )
    return version


# ----------------------------------------------------------------------------------------------
# CPU-only patches
# ----------------------------------------------------------------------------------------------

def patch_initialize_megatron() -> None:
    """Call ``initialize_megatron`` with ``allow_no_cuda=True``.

    ``pretrain()`` calls it without arguments, and its first line asserts
    ``torch.cuda.is_available()``; everything after that works on CPU with gloo.
    """
    import megatron.training as mt
    import megatron.training.initialize as mt_init
    import megatron.training.training as mt_training

    original = mt_init.initialize_megatron

    @functools.wraps(original)
    def initialize_megatron(*args: Any, **kwargs: Any) -> Any:
        if not args:
            kwargs["allow_no_cuda"] = True
        return original(*args, **kwargs)

    for module in (mt_init, mt_training, mt):
        replace_attribute(module, "initialize_megatron", initialize_megatron)


def patch_rng_state_functions() -> None:
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

    replace_attribute(mp_random, "_get_cuda_rng_state", _get_cuda_rng_state)
    replace_attribute(mp_random, "_set_cuda_rng_state", _set_cuda_rng_state)


class _SharedGeneratorWarningFilter(logging.Filter):
    """Drop the RNG tracker's "CPU RNG state changed within GPU RNG context" warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "CPU RNG state changed within GPU RNG context" not in record.getMessage()


def patch_rng_tracker_warning() -> None:
    """Silence the tracker's CPU-RNG-changed warning: on CPU both RNGs are one generator.

    ``CudaRNGStatesTracker.fork`` warns when the CPU generator moves inside a forked
    "CUDA" RNG region; with the CPU runtime, dropout inside the region *is* the CPU
    generator moving, so the warning would fire on every forward pass.
    """
    logger = logging.getLogger("megatron.core.tensor_parallel.random")
    PATCHED.append((logger, "filters", list(logger.filters)))
    logger.addFilter(_SharedGeneratorWarningFilter())


def patch_resume_rng_at_train_start() -> None:
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

    original_load = mt_training.load_checkpoint
    original_train = mt_training.train
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

    replace_attribute(mt_training, "load_checkpoint", load_checkpoint)
    replace_attribute(mt_training, "train", train)


def install_megatron_cpu_patches() -> None:
    """Apply every Megatron-level CPU patch."""
    patch_initialize_megatron()
    patch_rng_state_functions()
    patch_rng_tracker_warning()
    patch_resume_rng_at_train_start()


# ----------------------------------------------------------------------------------------------
# Wheel fixes (needed on GPUs too)
# ----------------------------------------------------------------------------------------------

_WHEEL_FIXES_INSTALLED = False


def patch_compile_helpers() -> None:
    """Make ``compile_helpers()`` a no-op when the prebuilt ``helpers_cpp`` extension imports.

    ``initialize_megatron`` runs ``make -C megatron/core/datasets`` on rank 0; the pip wheel
    ships the compiled ``helpers_cpp`` module but no Makefile, so ``make`` fails and
    ``compile_helpers`` calls ``sys.exit(1)``, killing the job before it starts.
    """
    import megatron.core.datasets.utils as ds_utils

    original = ds_utils.compile_helpers

    def compile_helpers() -> None:
        """Skip compilation when the prebuilt dataset helpers are importable."""
        try:
            from megatron.core.datasets import helpers_cpp  # noqa: F401
        except ImportError:
            original()

    replace_attribute(ds_utils, "compile_helpers", compile_helpers)


def patch_checkpoint_writer_without_psutil() -> None:
    """Let ``torch_dist`` checkpoint writers run when ``psutil`` is not installed.

    The async filesystem writer measures its RSS with ``psutil`` only for a debug log line,
    but raises ``RuntimeError`` without it, failing every ``torch_dist`` save; megatron-core
    does not declare ``psutil`` as a dependency. Report 0 bytes instead when it is missing.
    """
    import megatron.core.dist_checkpointing.strategies.filesystem_async as fs_async

    if getattr(fs_async, "HAVE_PSUTIL", True):
        return

    def _process_memory() -> int:
        """Resident memory is unknown without psutil; only used for a debug log line."""
        return 0

    replace_attribute(fs_async, "_process_memory", _process_memory)


def _uses_torch_adam_fallback() -> bool:
    """Whether the distributed optimizer wraps plain ``torch.optim.Adam`` (no Apex, no TE)."""
    import megatron.core.optimizer.distrib_optimizer as dist_opt

    return not dist_opt.HAVE_APEX_OR_TE


def patch_dist_optimizer_state_template() -> None:
    """Build the distributed optimizer's state template on a fresh torch Adam.

    Loading a ``torch_dist`` checkpoint first asks the (still empty) optimizer for its
    ``state_dict()`` as a template. With the torch-Adam fallback that reads ``step`` from
    the per-parameter state, finds none, and fails ``assert len(steps) == 1``. Fill the
    empty state with zero moments and a per-parameter ``step`` of 0 first; the checkpoint
    then overwrites all of it.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    original = DistributedOptimizer.state_dict

    @functools.wraps(original)
    def state_dict(self: DistributedOptimizer) -> dict:
        if _uses_torch_adam_fallback() and len(self.optimizer.state) == 0:
            for group in self.optimizer.param_groups:
                for param in group["params"]:
                    state = self.optimizer.state[param]
                    for key in self.optimizer_state_keys:
                        state[key] = torch.zeros_like(param, dtype=self._get_state_key_dtype(key))
                    state["step"] = torch.tensor(0.0)
        return original(self)

    replace_attribute(DistributedOptimizer, "state_dict", state_dict)


def patch_dist_optimizer_set_states_no_grad() -> None:
    """Copy loaded main params and moments into the optimizer under ``torch.no_grad()``.

    ``_set_main_param_and_optimizer_states`` ``copy_``s into the main parameter shard. In
    fp32 training that shard is a view of a model parameter that requires grad, and
    autograd rejects in-place writes to such views, so every resume fails.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    original = DistributedOptimizer._set_main_param_and_optimizer_states

    @functools.wraps(original)
    def _set_main_param_and_optimizer_states(self: DistributedOptimizer, model_param: torch.Tensor,
                                             tensors: dict) -> None:
        with torch.no_grad():
            original(self, model_param, tensors)

    replace_attribute(DistributedOptimizer, "_set_main_param_and_optimizer_states",
             _set_main_param_and_optimizer_states)


def patch_dist_optimizer_adam_step() -> None:
    """Restore torch Adam's ``step`` from the checkpoint, one tensor per parameter.

    With the torch-Adam fallback the distributed optimizer keeps the authoritative step
    in the saved param groups, but ``load_state_dict`` (a) hands one shared tensor to every
    parameter and (b) then copies the parameter-state template's ``step`` (0) over it, so
    Adam's bias correction restarts and the resumed loss diverges. After loading, give every
    parameter its own ``step`` tensor holding the checkpoint's value.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    original = DistributedOptimizer.load_state_dict

    @functools.wraps(original)
    def load_state_dict(self: DistributedOptimizer, state_dict: dict) -> None:
        original(self, state_dict)
        if not _uses_torch_adam_fallback() or self.ddp_config.use_megatron_fsdp:
            return
        groups = state_dict.get("optimizer", {}).get("param_groups", [])
        steps = {g["step"] for g in groups if g.get("step") is not None}
        if len(steps) != 1:
            return
        step = float(steps.pop())
        for state in self.optimizer.state.values():
            if "step" in state:
                state["step"] = torch.tensor(step, dtype=torch.float32)

    replace_attribute(DistributedOptimizer, "load_state_dict", load_state_dict)


def install_wheel_fixes() -> bool:
    """Apply the fixes for the pip wheel's own bugs (CPU or GPU); idempotent.

    Returns True when this call installed them, False when they already were.
    """
    global _WHEEL_FIXES_INSTALLED
    if _WHEEL_FIXES_INSTALLED:
        return False
    check_megatron_version()
    patch_compile_helpers()
    patch_checkpoint_writer_without_psutil()
    patch_dist_optimizer_state_template()
    patch_dist_optimizer_set_states_no_grad()
    patch_dist_optimizer_adam_step()
    _WHEEL_FIXES_INSTALLED = True
    return True
