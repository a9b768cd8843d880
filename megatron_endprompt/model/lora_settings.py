"""What a LoRA run asks for (``--endprompt-lora-*``), checked once at start-up.

Kept apart from :mod:`megatron_endprompt.model.lora` (the adapter modules) so that the run
builder reads the flags without importing torch or Megatron.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_endprompt.errors import UserError

__all__ = ["LORA_TARGETS", "LoraSettings", "lora_settings"]

#: Megatron-Core's dense linears an adapter may wrap, with their tensor-parallel kind: a
#: column-parallel linear splits its output rows over TP, a row-parallel one its input columns.
LORA_TARGETS: dict[str, str] = {"linear_qkv": "column", "linear_proj": "row",
                                "linear_fc1": "column", "linear_fc2": "row"}


@dataclass(frozen=True, kw_only=True)
class LoraSettings:
    """One run's adapters: ``W x`` becomes ``W x + (alpha / r) B A dropout(x)`` on each target,
    ``A [r, in]``, ``B [out, r]``, ``B = 0`` at the start."""

    rank: int
    """``r`` (``--endprompt-lora-rank``), > 0."""

    alpha: float
    """``alpha`` (``--endprompt-lora-alpha``; default ``r``, a scaling of 1)."""

    dropout: float = 0.0
    """Dropout on the adapter's input (``--endprompt-lora-dropout``), in ``[0, 1)``."""

    targets: tuple[str, ...] = tuple(LORA_TARGETS)
    """Module names wrapped (``--endprompt-lora-targets``), each a key of :data:`LORA_TARGETS`."""

    adapters_only: bool = False
    """``--endprompt-lora-adapters-only``: checkpoints hold the adapters and their optimizer
    state only; the frozen base is read from ``--pretrained-checkpoint`` at every launch."""

    seed: int = 1234
    """Seed of ``A``'s initialisation (Megatron's ``--seed``): one global draw per adapter, the
    same at every TP size, so layouts start from identical adapters."""

    @property
    def scaling(self) -> float:
        """``alpha / r``: the factor on ``B A`` (PEFT's ``scaling``)."""
        return self.alpha / self.rank


def lora_settings(*, rank: int | None, alpha: float | None, dropout: float | None,
                  targets: list[str] | None, adapters_only: bool = False,
                  seed: int = 1234) -> LoraSettings | None:
    """The run's :class:`LoraSettings` from the flag values (``None``: LoRA off, ``rank``
    unset or 0). Raises :class:`UserError` naming the flag and the fix."""
    if not rank:
        for flag, value in (("--endprompt-lora-alpha", alpha),
                            ("--endprompt-lora-dropout", dropout),
                            ("--endprompt-lora-targets", targets)):
            if value is not None:
                raise UserError(f"{flag} needs --endprompt-lora-rank r (> 0); add it or drop "
                                f"{flag}")
        if adapters_only:
            raise UserError("--endprompt-lora-adapters-only needs --endprompt-lora-rank r (> 0)")
        return None
    if rank < 0:
        raise UserError(f"--endprompt-lora-rank {rank} must be > 0 (0: no adapters)")
    if alpha is not None and not alpha > 0:
        raise UserError(f"--endprompt-lora-alpha {alpha:g} must be > 0")
    if dropout is not None and not 0.0 <= dropout < 1.0:
        raise UserError(f"--endprompt-lora-dropout {dropout:g} must be in [0, 1)")
    chosen = tuple(dict.fromkeys(targets)) if targets else tuple(LORA_TARGETS)
    unknown = [t for t in chosen if t not in LORA_TARGETS]
    if unknown:
        raise UserError(f"--endprompt-lora-targets {unknown[0]}: not a Megatron-Core linear "
                        f"with adapters; choose from {', '.join(LORA_TARGETS)}")
    return LoraSettings(rank=int(rank), alpha=float(alpha if alpha is not None else rank),
                        dropout=float(dropout or 0.0), targets=chosen,
                        adapters_only=bool(adapters_only), seed=int(seed))
