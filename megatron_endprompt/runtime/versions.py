"""The one Megatron-Core version gate of megatron_endprompt.

The runtime's patches and the model's ``GPTModel._preprocess`` override were written against
Megatron-Core 0.19.x; another minor release may move the private code they rely on, so it is
refused here, once, before anything is patched or built. Patch releases are let through: the
fingerprints of :mod:`megatron_endprompt.runtime.ledger` catch a changed function inside them.
"""

from __future__ import annotations

#: Megatron-Core ``major.minor`` versions the runtime and the model were written for.
SUPPORTED_MEGATRON_VERSIONS: tuple[str, ...] = ("0.19",)


def check_megatron_version() -> str:
    """Return Megatron-Core's version; ``RuntimeError`` (one line) if it is not supported."""
    from megatron.core import package_info

    version = package_info.__version__
    if ".".join(version.split(".")[:2]) not in SUPPORTED_MEGATRON_VERSIONS:
        raise RuntimeError(
            f"megatron_endprompt: Megatron-Core {version} is not supported (written for "
            f"{', '.join(v + '.x' for v in SUPPORTED_MEGATRON_VERSIONS)}); install "
            "megatron-core==0.19.2 or update megatron_endprompt/runtime and model/gpt.py")
    return version
