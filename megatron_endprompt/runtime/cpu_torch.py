"""PyTorch-level half of the CPU runtime: CUDA device arguments to CPU and ``torch.cuda`` stand-ins.

Megatron-Core allocates with ``device="cuda"`` / ``device=torch.cuda.current_device()``,
moves tensors with ``.cuda()`` / ``.to("cuda")``, compares ``Tensor.type()`` strings with
``"torch.cuda.FloatTensor"``, and calls into ``torch.cuda`` for streams, events, memory
statistics and RNG state. On a machine without a GPU each of those raises. The patches below
make them land on the CPU instead, while ``torch.cuda.is_available()`` keeps returning
``False`` so that Megatron's own CPU branches (gloo, CPU initialisation, ...) still run.

Every patch is a small named function with a docstring saying why it exists; each replaces
through the runtime's :class:`~megatron_endprompt.runtime.ledger.Ledger`, so
``runtime.uninstall()`` restores the originals. The stand-ins replace ``torch.cuda`` functions
wholesale (nothing of the original is reused), so only their presence is checked.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction
from torch.overrides import TorchFunctionMode

from megatron_endprompt.runtime.ledger import Ledger

_PATCH = "cpu-torch"


def _put(ledger: Ledger, owner: Any, name: str, value: Any) -> None:
    """``owner.name = value`` through the ledger (attributes a torch build lacks are added)."""
    ledger.replace(owner, name, value, patch=_PATCH, must_exist=False)


# ----------------------------------------------------------------------------------------------
# Device rewriting
# ----------------------------------------------------------------------------------------------

def _is_cuda_device(device: Any) -> bool:
    """Whether ``device`` names a CUDA device (``"cuda"``, ``"cuda:1"``, ``torch.device``,
    index)."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    # A bare integer device means ``cuda:<index>`` (``torch.cuda.current_device()`` returns one).
    return isinstance(device, int) and not isinstance(device, bool)


_CPU = torch.device("cpu")


class CudaToCpuMode(TorchFunctionMode):
    """Rewrite CUDA ``device=`` arguments (and ``Tensor.to(<cuda>)``) to the CPU.

    A ``TorchFunctionMode`` sees every torch function call, including factory functions
    (``torch.empty(..., device="cuda")``) that no tensor subclass could intercept.
    """

    def __torch_function__(self, func: Callable, types: tuple, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and _is_cuda_device(device):
            kwargs = {**kwargs, "device": _CPU}
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], _CPU, *args[2:])
        return func(*args, **kwargs)


_MODE = CudaToCpuMode()
_ORIGINAL_THREAD_START = threading.Thread.start


def push_device_mode_in_this_thread(ledger: Ledger) -> None:
    """Push :class:`CudaToCpuMode` for the calling thread (modes are thread-local); popped
    again by ``ledger.restore()``."""
    _MODE.__enter__()
    ledger.on_restore(lambda: _MODE.__exit__(None, None, None), patch=_PATCH)


def patch_thread_start(ledger: Ledger) -> None:
    """Push the device mode in every new thread too.

    Torch function modes live on a per-thread stack, so Megatron's helper threads (async
    checkpoint writers, prefetchers, ...) would otherwise allocate on "cuda" and fail.
    """

    def start(self: threading.Thread) -> None:
        run = self.run

        def run_with_cpu_mode() -> None:
            with _MODE:
                run()

        self.run = run_with_cpu_mode  # instance attribute shadows the class's run
        _ORIGINAL_THREAD_START(self)

    _put(ledger, threading.Thread, "start", start)


def patch_custom_backward(ledger: Ledger) -> None:
    """Push the device mode around every custom autograd function's backward too.

    The autograd engine runs a ``torch.autograd.Function``'s ``backward`` with the calling
    thread's torch function modes cleared, so Megatron's backward passes that allocate on
    ``torch.cuda.current_device()`` (the sequence-parallel gather and reduce-scatter, the
    linear layers' input all-gather) would otherwise fail on a CPU.
    """
    for name in ("apply", "apply_boxed"):
        original = getattr(BackwardCFunction, name)

        def run_with_cpu_mode(self: Any, *args: Any, _original: Callable = original) -> Any:
            with _MODE:
                return _original(self, *args)

        run_with_cpu_mode.__doc__ = (f"BackwardCFunction.{name} under the CPU device mode "
                                     f"(megatron_endprompt.runtime).")
        _put(ledger, BackwardCFunction, name, run_with_cpu_mode)


def patch_tensor_cuda(ledger: Ledger) -> None:
    """``Tensor.cuda()`` / ``Module.cuda()`` return the CPU tensor unchanged (identity)."""

    def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False,
             memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
        return self

    _put(ledger, torch.Tensor, "cuda", cuda)


def patch_tensor_type(ledger: Ledger) -> None:
    """``Tensor.type()`` reports ``torch.cuda.*`` names to Megatron callers.

    Megatron's optimizers and ``clip_grads`` decide what a parameter is by comparing
    ``param.type()`` with ``"torch.cuda.FloatTensor"`` etc. Only callers whose module
    name starts with ``megatron`` see the CUDA spelling; everybody else sees the truth.
    A string argument naming a CUDA type is converted to its CPU twin.
    """
    original = torch.Tensor.type

    def type_(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False,
              **kwargs: Any) -> Any:
        if dtype is None:
            name = original(self)
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if (caller.startswith("megatron.") and name.startswith("torch.")
                    and ".cuda." not in name):
                return "torch.cuda." + name[len("torch."):]
            return name
        if isinstance(dtype, str) and dtype.startswith("torch.cuda."):
            dtype = "torch." + dtype[len("torch.cuda."):]
        return original(self, dtype, non_blocking, **kwargs)

    _put(ledger, torch.Tensor, "type", type_)


# ----------------------------------------------------------------------------------------------
# torch.cuda stand-ins
# ----------------------------------------------------------------------------------------------

def _named(name: str, fn: Callable) -> Callable:
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"CPU stand-in for torch.cuda.{name} (megatron_endprompt.runtime)."
    return fn


def _noop(name: str) -> Callable:
    """A fresh no-op function object (torch.compile rejects one object under two names)."""

    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    return _named(name, noop)


def _const(name: str, value: Any) -> Callable:
    """A fresh function object returning ``value``."""

    def const(*args: Any, **kwargs: Any) -> Any:
        return value

    return _named(name, const)


class _DummyStream:
    """Stand-in for ``torch.cuda.Stream``: every operation completes immediately on CPU."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.device = _CPU
        self.priority = kwargs.get("priority", 0)

    def wait_stream(self, stream: Any) -> None:
        """CPU work is synchronous: nothing to wait for."""

    def wait_event(self, event: Any) -> None:
        """CPU work is synchronous: nothing to wait for."""

    def record_event(self, event: Any = None) -> _DummyEvent:
        """Return a (completed) event."""
        return event if event is not None else _DummyEvent()

    def synchronize(self) -> None:
        """CPU work is synchronous."""

    def query(self) -> bool:
        """Always done."""
        return True

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """CUDA reports (lowest, highest); one level here."""
        return (0, 0)

    def __enter__(self) -> _DummyStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class _DummyEvent:
    """Stand-in for ``torch.cuda.Event``: always complete, zero elapsed time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        """Nothing to record on CPU."""

    def wait(self, stream: Any = None) -> None:
        """Nothing to wait for on CPU."""

    def synchronize(self) -> None:
        """Nothing to wait for on CPU."""

    def query(self) -> bool:
        """Always done."""
        return True

    def elapsed_time(self, end_event: Any) -> float:
        """No device timeline on CPU."""
        return 0.0


class _DeviceProperties:
    """What ``torch.cuda.get_device_properties`` returns, for an imaginary sm_90 device."""

    name = "CPU (megatron_endprompt runtime)"
    major, minor = 9, 0
    total_memory = 0
    multi_processor_count = 1
    gcnArchName = ""
    uuid = "cpu"
    L2_cache_size = 0


def _stream_context(stream: Any = None) -> nullcontext:
    """``torch.cuda.stream(s)``: a no-op context on CPU."""
    return nullcontext(stream)


def _device_context(device: Any = None) -> nullcontext:
    """``torch.cuda.device(d)``: a no-op context on CPU."""
    return nullcontext(device)


_STANDIN_STREAM = _DummyStream()


def patch_torch_cuda(ledger: Ledger) -> None:
    """Install ``torch.cuda`` stand-ins that behave like one idle, synchronous device.

    ``device_count()`` is 1 (Megatron skips model-parallel init and CUDA seeding at 0),
    ``current_device()`` 0, compute capability (9, 0); memory statistics are 0; streams and
    events complete immediately; ``is_available()`` is left alone (False) so Megatron's
    CPU branches still run.
    """
    c = torch.cuda
    for name in ("set_device", "synchronize", "empty_cache", "reset_peak_memory_stats",
                 "reset_max_memory_allocated", "reset_max_memory_cached", "ipc_collect",
                 "set_stream", "_sleep"):
        _put(ledger, c, name, _noop(name))
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "device_memory_used", "utilization", "temperature",
                 "power_draw", "clock_rate"):
        _put(ledger, c, name, _const(name, 0))
    _put(ledger, c, "device_count", _const("device_count", 1))
    _put(ledger, c, "current_device", _const("current_device", 0))
    _put(ledger, c, "is_current_stream_capturing", _const("is_current_stream_capturing", False))
    _put(ledger, c, "memory_stats", _named("memory_stats", lambda *a, **k: {}))
    _put(ledger, c, "mem_get_info", _const("mem_get_info", (0, 0)))
    _put(ledger, c, "get_device_capability", _const("get_device_capability", (9, 0)))
    _put(ledger, c, "get_device_name", _const("get_device_name", _DeviceProperties.name))
    _put(ledger, c, "get_device_properties", _const("get_device_properties", _DeviceProperties()))
    _put(ledger, c, "Stream", _DummyStream)
    _put(ledger, c, "ExternalStream", _DummyStream)
    _put(ledger, c, "Event", _DummyEvent)
    _put(ledger, c, "current_stream", _const("current_stream", _STANDIN_STREAM))
    _put(ledger, c, "default_stream", _const("default_stream", _STANDIN_STREAM))
    _put(ledger, c, "stream", _stream_context)
    _put(ledger, c, "device", _device_context)


def patch_cuda_rng(ledger: Ledger) -> None:
    """Route the CUDA RNG calls to the CPU default generator.

    Megatron's RNG tracker stores and swaps "CUDA" RNG states around dropout in
    tensor-parallel regions; on CPU the generator that dropout actually draws from is
    the CPU one, so that is the one to seed, save and restore.
    """
    c = torch.cuda

    # torch.manual_seed() itself calls torch.cuda.manual_seed_all(), so these must talk to
    # the CPU generator object directly instead of going through torch.manual_seed & co.
    gen = torch.default_generator

    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        return gen.get_state()

    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        gen.set_state(new_state)

    def get_rng_state_all() -> list[torch.Tensor]:
        return [gen.get_state()]

    def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
        gen.set_state(new_states[0])

    def manual_seed(seed: int) -> None:
        gen.manual_seed(int(seed))

    def manual_seed_all(seed: int) -> None:
        gen.manual_seed(int(seed))

    def initial_seed() -> int:
        return gen.initial_seed()

    for fn in (get_rng_state, set_rng_state, get_rng_state_all, set_rng_state_all,
               manual_seed, manual_seed_all, initial_seed):
        fn.__doc__ = f"CPU stand-in for torch.cuda.{fn.__name__}: uses the CPU generator."
        _put(ledger, c, fn.__name__, fn)
        if hasattr(c.random, fn.__name__):
            _put(ledger, c.random, fn.__name__, fn)


def install_torch_patches(ledger: Ledger) -> None:
    """Apply every torch-level patch and push the device mode in the calling thread."""
    patch_tensor_cuda(ledger)
    patch_tensor_type(ledger)
    patch_torch_cuda(ledger)
    patch_cuda_rng(ledger)
    patch_thread_start(ledger)
    patch_custom_backward(ledger)
    push_device_mode_in_this_thread(ledger)
