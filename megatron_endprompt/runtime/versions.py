"""The one Megatron-Core version gate of megatron_endprompt, and the table of what differs.

Supported: ``>=0.18,<0.21`` — megatron-core 0.18.x and 0.19.x from PyPI and Megatron-LM main
(0.20.0). 0.17 and older are refused before anything is patched or built: they lack the
``megatron.training`` config-container entry (``pretrain_cfg_container_from_args``) and the
tokenizer registry the pretrain entry and the data pipeline are built on (0.16 ships no
``megatron.training`` at all), so they would need a second training entry.

Inside the range, every difference our code meets is one row of :class:`MegatronFeatures`,
detected from the installed code (a signature, an attribute, a source string) rather than from
the version number, so a patch release that back-ports a change is served too:

=============================  ==========  ==========  ==================================
feature                        0.18.x      0.19.x      0.20 (main)
=============================  ==========  ==========  ==================================
``pretrain`` takes             positional  keyword     keyword
``model_provider``             (3rd arg)
``DistributedOptimizer.        missing     present     present
optimizer_state_keys``         (exp_avg,
                               exp_avg_sq)
tokenizer builder reads        no          no          yes
``args.use_gigatoken``
=============================  ==========  ==========  ==================================

The fingerprints of the functions the runtime patches are kept per reviewed version (see
:mod:`megatron_endprompt.runtime.ledger`); a function whose code differs from every reviewed
version is refused with one line.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

__all__ = ["MegatronFeatures", "SUPPORTED_RANGE", "call_pretrain", "check_megatron_version",
           "megatron_features", "optimizer_state_key_dtypes", "tokenizer_namespace_extras"]

#: ``(lowest, first unsupported)`` Megatron-Core ``(major, minor)``.
SUPPORTED_RANGE: tuple[tuple[int, int], tuple[int, int]] = ((0, 18), (0, 21))

#: The Megatron-LM main commit checked by hand (its package version is 0.20.0).
MAIN_COMMIT_TESTED = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"


def _range_text() -> str:
    (a, b), (c, d) = SUPPORTED_RANGE
    return f">={a}.{b},<{c}.{d}"


def check_megatron_version() -> str:
    """Return Megatron-Core's version; ``RuntimeError`` (one line, with the reason) outside
    :data:`SUPPORTED_RANGE`."""
    from megatron.core import package_info

    version = package_info.__version__
    try:
        major_minor = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:
        major_minor = (-1, -1)
    low, high = SUPPORTED_RANGE
    if major_minor < low:
        raise RuntimeError(
            f"megatron_endprompt: Megatron-Core {version} is not supported (supported "
            f"{_range_text()}): releases before 0.18 lack megatron.training's config-container "
            "pretrain entry and tokenizer registry; install megatron-core==0.19.2")
    if major_minor >= high:
        raise RuntimeError(
            f"megatron_endprompt: Megatron-Core {version} is not supported (supported "
            f"{_range_text()}; newer releases are unreviewed); install megatron-core==0.19.2 "
            "or review megatron_endprompt/runtime for it")
    return version


@dataclass(frozen=True, kw_only=True)
class MegatronFeatures:
    """What the installed Megatron-Core offers where supported releases differ."""

    version: str
    """``megatron.core.package_info.__version__``."""
    pretrain_model_provider_positional: bool
    """``megatron.training.pretrain`` takes ``model_provider`` as its third positional argument
    (0.18), not as a keyword after ``forward_step_func`` (0.19+)."""
    optimizer_state_keys: bool
    """``DistributedOptimizer`` has ``optimizer_state_keys`` / ``_get_state_key_dtype``
    (0.19+); 0.18 hard-codes Adam's ``exp_avg``/``exp_avg_sq`` with the config's dtypes."""
    tokenizer_use_gigatoken: bool
    """Megatron's tokenizer builder reads ``args.use_gigatoken`` (main, 0.20)."""


@functools.lru_cache(maxsize=1)
def megatron_features() -> MegatronFeatures:
    """Detect :class:`MegatronFeatures` of the installed Megatron-Core (after the gate)."""
    version = check_megatron_version()
    import megatron.core.tokenizers.utils.build_tokenizer as build_tokenizer
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.training import training as mt  # the defining module: a re-export may be
    # replaced (a test stub, a wrapper) while the signature to match is the real one's

    params = list(inspect.signature(mt.pretrain).parameters)
    return MegatronFeatures(
        version=version,
        pretrain_model_provider_positional=params.index("model_provider") == 2,
        optimizer_state_keys=hasattr(DistributedOptimizer, "optimizer_state_keys"),
        tokenizer_use_gigatoken="use_gigatoken" in inspect.getsource(build_tokenizer),
    )


def call_pretrain(pretrain: Any, cfg: Any, datasets_provider: Any, model_type: Any,
                  forward_step: Any, *, model_provider: Any, **kwargs: Any) -> Any:
    """``megatron.training.pretrain`` with ``model_provider`` where this release takes it."""
    if megatron_features().pretrain_model_provider_positional:
        return pretrain(cfg, datasets_provider, model_provider, model_type, forward_step,
                        **kwargs)
    return pretrain(cfg, datasets_provider, model_type, forward_step,
                    model_provider=model_provider, **kwargs)


def optimizer_state_key_dtypes(optimizer: Any) -> list[tuple[str, Any]]:
    """``[(key, dtype), ...]`` of the distributed optimizer's per-parameter Adam moments."""
    if megatron_features().optimizer_state_keys:
        return [(k, optimizer._get_state_key_dtype(k)) for k in optimizer.optimizer_state_keys]
    return [("exp_avg", optimizer.config.exp_avg_dtype),
            ("exp_avg_sq", optimizer.config.exp_avg_sq_dtype)]


def tokenizer_namespace_extras() -> dict[str, Any]:
    """Fields Megatron's tokenizer builder reads beyond 0.19's set, with Megatron's defaults."""
    return {"use_gigatoken": False} if megatron_features().tokenizer_use_gigatoken else {}
