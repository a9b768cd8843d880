"""Runtime layers that let Megatron-Core's real trainer run where it otherwise would not.

``install_cpu_runtime()`` makes ``megatron.training.pretrain`` train on CPU (gloo) when no
GPU is present and does nothing otherwise; ``install_wheel_fixes()`` repairs bugs of the
Megatron-Core pip wheel that bite GPU runs too.
"""

from __future__ import annotations

from megatron_endprompt.runtime.cpu import CPU_ARGS, install_cpu_runtime, is_installed


def install_wheel_fixes() -> bool:
    """Apply the Megatron-Core wheel fixes (CPU or GPU); see :mod:`.cpu_megatron`."""
    from megatron_endprompt.runtime.cpu_megatron import install_wheel_fixes as _install

    return _install()


__all__ = ["CPU_ARGS", "install_cpu_runtime", "install_wheel_fixes", "is_installed"]
