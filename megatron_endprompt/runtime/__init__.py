"""The only code of megatron_endprompt that changes torch or Megatron-Core.

One entry, :func:`install`, called once at process start (before Megatron builds anything;
the pretrain entry does it):

* the version gate (:mod:`.versions`), once;
* the wheel fixes (:mod:`.wheel`), always — GPU runs hit the wheel's bugs too;
* the TE fused-RoPE router for per-row freqs (:mod:`.rope`), when TE's kernel is present;
* the CPU layer (:mod:`.cpu`), only when ``torch.cuda.is_available()`` is False;
* with ``trainer=True`` (the pretrain entry), the training rank's process-wide settings
  (:mod:`.process`, :mod:`.child_death`): ``CUDA_DEVICE_MAX_CONNECTIONS=1`` unless set, and
  the child reaper (checkpoint-writer children exit with the rank).

:func:`quiet` (every tool, before it imports Megatron) installs the import-noise warning
filters the same way, :func:`tokenizer_env` preprocessing's tokenizer variables, and
:func:`scoped_env` a scoped rendezvous. Nothing else in the package changes process-wide state.

Each layer patches through a :class:`~.ledger.Ledger` (:func:`uninstall` restores every
original) that first checks each patched Megatron function's fingerprint, so a Megatron change
under a patch fails with one line. :func:`cpu_forward` and :func:`cpu_checkpoint_io` are
scoped variants for in-process CPU work (conversion, unit tests).
"""

from __future__ import annotations

import sys

from megatron_endprompt.runtime.child_death import install_child_reaper
from megatron_endprompt.runtime.cpu import CPU_ARGS, import_megatron_eager, with_cpu_args
from megatron_endprompt.runtime.ledger import Ledger, PatchedFunctionChanged, fingerprint
from megatron_endprompt.runtime.process import (
    CHECKPOINT_NOISE,
    IMPORT_NOISE,
    quiet_warnings,
    scoped_env,
    set_env_default,
)
from megatron_endprompt.runtime.scoped import cpu_checkpoint_io, cpu_forward
from megatron_endprompt.runtime.versions import check_megatron_version

__all__ = ["CPU_ARGS", "Ledger", "PatchedFunctionChanged", "check_megatron_version",
           "cpu_checkpoint_io", "cpu_forward", "fingerprint", "import_megatron_eager", "install",
           "installed_layers",
           "LAYER_NAMES", "patches", "quiet",
           "scoped_env", "tokenizer_env", "uninstall", "with_cpu_args"]

#: Layer name -> its ledger, for the layers installed in this process.
_LAYERS: dict[str, Ledger] = {}


def _install_layer(name: str, step) -> None:
    """Run ``step(ledger)`` as layer ``name`` unless it is installed; a failing step leaves
    nothing of itself behind."""
    if name in _LAYERS:
        return
    ledger = Ledger()
    try:
        step(ledger)
    except BaseException:
        ledger.restore()
        raise
    _LAYERS[name] = ledger


def _trainer_process(ledger: Ledger) -> None:
    # Megatron requires this for TP>1 (kernel launches ordered on one CUDA queue)
    set_env_default(ledger, "CUDA_DEVICE_MAX_CONNECTIONS", "1", patch="trainer-env")
    install_child_reaper(ledger)


def quiet(*, checkpoints: bool = False) -> None:
    """Silence import-time chatter that is not actionable (:data:`.process.IMPORT_NOISE`, and
    torch's 'No CUDA runtime' log line on CPU) as layer ``quiet``; ``checkpoints``: also
    torch.distributed.checkpoint's notices and Megatron's checkpoint loggers (layer
    ``quiet-checkpoints``). Call before importing Megatron; undone by :func:`uninstall`."""
    _install_layer("quiet", lambda ledger: quiet_warnings(
        ledger, IMPORT_NOISE, loggers=("torch.utils.cpp_extension",)))
    if checkpoints:
        _install_layer("quiet-checkpoints", lambda ledger: quiet_warnings(
            ledger, CHECKPOINT_NOISE, patch="quiet-checkpoints",
            loggers=("megatron.core.dist_checkpointing", "megatron.core.models.gpt.gpt_model")))


def install(*, cpu: bool | None = None, verbose: bool = True,
            trainer: bool = False) -> dict[str, bool]:
    """Install the runtime once per process; later calls add only layers still missing.

    Args:
        cpu: install the CPU layer; ``None`` (default) = exactly when CUDA is unavailable.
            ``True`` forces it on a GPU machine (tests), ``False`` never installs it.
        verbose: print one line to stderr when the CPU layer is installed.
        trainer: also the training rank's process-wide settings (layer ``trainer``: the
            CUDA launch-queue variable, the child reaper); listed by :func:`patches`.

    Returns: ``{"wheel": True, "rope": bool, "cpu": bool}`` — which of its layers are installed
    now (:func:`installed_layers` lists every layer, ``trainer`` included).

    Raises:
        RuntimeError: unsupported Megatron-Core version, or
            :class:`PatchedFunctionChanged`: a patched function is not the one the patch was
            written for. Nothing stays patched by the failing call.
    """
    import torch

    if cpu is None:
        cpu = not torch.cuda.is_available()
    if cpu and trainer:  # first: the version check and the patch modules import Megatron
        import_megatron_eager()  # a CPU training rank: no import-time torch.compile
    version = check_megatron_version()
    from megatron_endprompt.runtime.cpu import install_cpu_layer
    from megatron_endprompt.runtime.rope import install_rope_fallback
    from megatron_endprompt.runtime.wheel import install_wheel_fixes

    steps = [("wheel", install_wheel_fixes), ("rope", install_rope_fallback)]
    if cpu:
        steps.append(("cpu", install_cpu_layer))
    if trainer:
        steps.append(("trainer", _trainer_process))
    for name, step in steps:
        if name in _LAYERS:
            continue
        _install_layer(name, step)
        if name == "cpu" and verbose:
            print(f"megatron_endprompt: no CUDA device, running Megatron-Core {version} on CPU "
                  "(megatron_endprompt.runtime)", file=sys.stderr, flush=True)
    layers = installed_layers()
    return {name: layers[name] for name in ("wheel", "rope", "cpu")}


def tokenizer_env(*, threads: int, forked_workers: bool = False) -> None:
    """Layer ``tokenizer-env``: HF ``tokenizers``' process-wide settings for preprocessing.
    ``RAYON_RS_NUM_THREADS=threads`` (``encode_batch``'s pool gets ``--workers`` threads, as
    Megatron-LM's tool uses ``--workers`` processes) and, with ``forked_workers`` (a worker
    pool forks after the rayon pool ran), ``TOKENIZERS_PARALLELISM=false`` so the children do
    not warn; each only when unset, removed again by :func:`uninstall`. A later call adds only
    the fork setting still missing."""
    _install_layer("tokenizer-env", lambda ledger: set_env_default(
        ledger, "RAYON_RS_NUM_THREADS", str(threads), patch="tokenizer-env"))
    if forked_workers:
        set_env_default(_LAYERS["tokenizer-env"], "TOKENIZERS_PARALLELISM", "false",
                        patch="tokenizer-env")


def uninstall() -> int:
    """Restore every original replaced by :func:`install` (last layer first); returns the
    number of ledger entries undone."""
    n = 0
    for name in reversed(list(_LAYERS)):
        n += _LAYERS.pop(name).restore()
    return n


#: Every layer this module installs, in install order: :func:`install`'s four, then
#: :func:`quiet`'s two and :func:`tokenizer_env`'s.
LAYER_NAMES = ("wheel", "rope", "cpu", "trainer", "quiet", "quiet-checkpoints", "tokenizer-env")


def installed_layers() -> dict[str, bool]:
    """Each of :data:`LAYER_NAMES` -> whether that layer is installed in this process
    (``rope`` is True only when TE's fused kernel was present to route around)."""
    return {name: name in _LAYERS and (name != "rope" or len(_LAYERS[name]) > 0)
            for name in LAYER_NAMES}


def patches() -> list[tuple[str, str]]:
    """``[(patch, "module.Owner.attr"), ...]`` of every replacement now in place."""
    return [entry for ledger in _LAYERS.values() for entry in ledger.entries()]
