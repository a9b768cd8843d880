"""Fixes for bugs of the Megatron-Core pip wheel that bite every run, GPU or CPU.

Installed by ``runtime.install()`` always (GPU runs need them as much as the CPU layer does):
the wheel ships no Makefile for the dataset helpers (stock ``compile_helpers()`` calls
``sys.exit(1)`` at start-up), ``torch_dist`` saves need ``psutil`` for a debug line, and the
distributed optimizer with the torch-Adam fallback cannot resume; the console's second loss of a
launch is the mean of two iterations (:mod:`.log_sums`). Reviewed against
Megatron-Core 0.18.2, 0.19.2 and main (0.20.0); :data:`FINGERPRINTS` pins the functions patched,
:mod:`.versions` holds what differs (0.18 has no ``optimizer_state_keys``).
"""

from __future__ import annotations

import functools

import torch

from megatron_endprompt.runtime.ledger import Ledger
from megatron_endprompt.runtime.log_sums import patch_first_log_reset
from megatron_endprompt.runtime.versions import megatron_features, optimizer_state_key_dtypes

_PATCH = "wheel"

#: Fingerprints (:func:`~megatron_endprompt.runtime.ledger.fingerprint`) of the Megatron-Core
#: functions these fixes wrap or replace, per reviewed release (0.20.0 = Megatron-LM main
#: d98e8a64); each release's diff was read against the patch.
FINGERPRINTS: dict[str, dict[str, str]] = {
    "compile_helpers": {"0.18.2, 0.19.2, 0.20.0": "5a35bf59f816"},
    "_process_memory": {"0.18.2, 0.19.2, 0.20.0": "d2ff0b0c6612"},
    "state_dict": {"0.18.2, 0.19.2, 0.20.0": "6cd723748cff"},
    "_set_main_param_and_optimizer_states": {"0.18.2, 0.19.2, 0.20.0": "26700b0b27e4"},
    "load_state_dict": {
        "0.18.2": "44770961195d",
        "0.19.2": "cd62563b01bb",
        "0.20.0": "cd62563b01bb",
    },
}


def patch_compile_helpers(ledger: Ledger) -> None:
    """Make ``compile_helpers()`` a no-op when the prebuilt ``helpers_cpp`` extension imports.

    ``initialize_megatron`` runs ``make -C megatron/core/datasets`` on rank 0; the pip wheel
    ships the compiled ``helpers_cpp`` module but no Makefile, so ``make`` fails and
    ``compile_helpers`` calls ``sys.exit(1)``, killing the job before it starts.
    """
    import megatron.core.datasets.utils as ds_utils

    original = ledger.check(ds_utils, "compile_helpers", FINGERPRINTS["compile_helpers"],
                            patch=_PATCH)

    def compile_helpers() -> None:
        """Skip compilation when the prebuilt dataset helpers are importable."""
        try:
            from megatron.core.datasets import helpers_cpp  # noqa: F401
        except ImportError:
            original()

    ledger.replace(ds_utils, "compile_helpers", compile_helpers, patch=_PATCH)


def patch_checkpoint_writer_without_psutil(ledger: Ledger) -> None:
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

    ledger.replace(fs_async, "_process_memory", _process_memory, patch=_PATCH,
                   expected=FINGERPRINTS["_process_memory"])


def _uses_torch_adam_fallback() -> bool:
    """Whether the distributed optimizer wraps plain ``torch.optim.Adam`` (no Apex, no TE)."""
    import megatron.core.optimizer.distrib_optimizer as dist_opt

    return not dist_opt.HAVE_APEX_OR_TE


def patch_dist_optimizer_state_template(ledger: Ledger) -> None:
    """Build the distributed optimizer's state template on a fresh torch Adam.

    Loading a ``torch_dist`` checkpoint first asks the (still empty) optimizer for its
    ``state_dict()`` as a template. With the torch-Adam fallback that reads ``step`` from
    the per-parameter state, finds none, and fails ``assert len(steps) == 1``. Fill the
    empty state with zero moments and a per-parameter ``step`` of 0 first; the checkpoint
    then overwrites all of it.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    original = ledger.check(DistributedOptimizer, "state_dict", FINGERPRINTS["state_dict"],
                            patch=_PATCH)

    @functools.wraps(original)
    def state_dict(self: DistributedOptimizer) -> dict:
        if _uses_torch_adam_fallback() and len(self.optimizer.state) == 0:
            for group in self.optimizer.param_groups:
                for param in group["params"]:
                    state = self.optimizer.state[param]
                    for key, dtype in optimizer_state_key_dtypes(self):
                        state[key] = torch.zeros_like(param, dtype=dtype)
                    state["step"] = torch.tensor(0.0)
        return original(self)

    ledger.replace(DistributedOptimizer, "state_dict", state_dict, patch=_PATCH)


def patch_dist_optimizer_set_states_no_grad(ledger: Ledger) -> None:
    """Copy loaded main params and moments into the optimizer under ``torch.no_grad()``.

    ``_set_main_param_and_optimizer_states`` ``copy_``s into the main parameter shard. In
    fp32 training that shard is a view of a model parameter that requires grad, and
    autograd rejects in-place writes to such views, so every resume fails.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    name = "_set_main_param_and_optimizer_states"
    original = ledger.check(DistributedOptimizer, name, FINGERPRINTS[name], patch=_PATCH)

    @functools.wraps(original)
    def _set_main_param_and_optimizer_states(self: DistributedOptimizer, model_param: torch.Tensor,
                                             tensors: dict) -> None:
        with torch.no_grad():
            original(self, model_param, tensors)

    ledger.replace(DistributedOptimizer, "_set_main_param_and_optimizer_states",
                   _set_main_param_and_optimizer_states, patch=_PATCH)


def patch_dist_optimizer_adam_step(ledger: Ledger) -> None:
    """Restore torch Adam's ``step`` from the checkpoint, one tensor per parameter.

    With the torch-Adam fallback the distributed optimizer keeps the authoritative step
    in the saved param groups, but ``load_state_dict`` (a) hands one shared tensor to every
    parameter and (b) then copies the parameter-state template's ``step`` (0) over it, so
    Adam's bias correction restarts and the resumed loss diverges. After loading, give every
    parameter its own ``step`` tensor holding the checkpoint's value.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    original = ledger.check(DistributedOptimizer, "load_state_dict",
                            FINGERPRINTS["load_state_dict"], patch=_PATCH)

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

    ledger.replace(DistributedOptimizer, "load_state_dict", load_state_dict, patch=_PATCH)


def check_helpers(ledger: Ledger) -> None:
    """The Megatron names the fixes' bodies call (not patched, so not fingerprinted) must exist:
    a release that drops one fails here, at install, not at the first resume."""
    import megatron.core.optimizer.distrib_optimizer as dist_opt
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    ledger.check(dist_opt, "HAVE_APEX_OR_TE", None, patch=_PATCH)
    ledger.check(DistributedDataParallelConfig, "use_megatron_fsdp", None, patch=_PATCH)
    if megatron_features().optimizer_state_keys:
        ledger.check(dist_opt.DistributedOptimizer, "_get_state_key_dtype", None, patch=_PATCH)
    else:
        for name in ("exp_avg_dtype", "exp_avg_sq_dtype"):
            ledger.check(OptimizerConfig, name, None, patch=_PATCH)


def install_wheel_fixes(ledger: Ledger) -> None:
    """Apply the wheel fixes this process needs through ``ledger``: the Adam-step and
    state-template fixes only with the torch-Adam fallback (no TE, no Apex: a CPU run, or a
    GPU machine without either), the others always (``_process_memory`` only without
    ``psutil``)."""
    check_helpers(ledger)
    patch_compile_helpers(ledger)
    patch_checkpoint_writer_without_psutil(ledger)
    patch_first_log_reset(ledger)  # the second console loss of a launch: one iteration's
    torch_adam = _uses_torch_adam_fallback()  # TE's / Apex's fused Adam keep step and state
    if torch_adam:
        patch_dist_optimizer_state_template(ledger)
    patch_dist_optimizer_set_states_no_grad(ledger)  # fp32 resumes, whichever Adam
    if torch_adam:
        patch_dist_optimizer_adam_step(ledger)
