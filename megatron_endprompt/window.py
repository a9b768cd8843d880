"""The EndPrompt window — ``L``, ``L0``, ``s`` and the run's loss-weight overrides — resolved and
validated here and nowhere else (the weights by
:class:`~megatron_endprompt.loss_weights.LossWeights`).

Preprocessing (``layout.LayoutConfig``), the dataset, the training flags, the RoPE module and the
HF export all build an :class:`EndPromptWindow` and trust it. It is the bottom of the package
graph (imports nothing of the package but :mod:`.loss_weights`), so every
stage may use it.

Defaults, as the official EndPrompt code: ``L0`` is the *model's* original window (its
``max_position_embeddings``, the loaded checkpoint's when there is one), not the physical training
length ``P``; ``s = ceil(L / L0)``. Llama-3 8B (``L0 = 8192``) trained at ``P = 4096`` for
``L = 65536`` gets ``s = 8``, not ``ceil(65536 / 4096) = 16``. ``L`` may equal ``L0`` (``s = 1``,
no interpolation: fine-tuning at the model's own window with terminals at its end); only
``L < L0`` is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from megatron_endprompt.loss_weights import LossWeights

__all__ = ["EXPORT_FLAGS", "EndPromptWindow", "LAUNCH_FLAGS", "PLAN_FLAGS", "PREPROCESS_FLAGS",
           "TRAINING_FLAGS", "explicit_pi_factor", "resolve_pi_factor"]

#: The largest position (and so ``L``) a sidecar record holds: records are int32.
MAX_POSITION = 2**31 - 1

#: How each field is spelled on the command line of each tool (error messages name the flag).
TRAINING_FLAGS: Mapping[str, str] = MappingProxyType({
    "target_length": "--endprompt-target-length",
    "seq_length": "--seq-length",
    "original_length": "--endprompt-original-length",
    "pi_factor": "--endprompt-pi-factor",
    "terminal_loss_weight": "--endprompt-terminal-loss-weight",
    "context_loss_weight": "--endprompt-context-loss-weight",
    "megatron_pi_factor": "--rotary-seq-len-interpolation-factor",
})
PREPROCESS_FLAGS: Mapping[str, str] = MappingProxyType({
    **TRAINING_FLAGS,
    "target_length": "--target-length",
    "terminal_loss_weight": "--terminal-loss-weight",
    "context_loss_weight": "--context-loss-weight",
})
#: The launch script's variables (``examples/pretrain_llama3_endprompt.sh``), for its start-up
#: checks: a refusal names the variable the user sets, not the Megatron flag it becomes.
LAUNCH_FLAGS: Mapping[str, str] = MappingProxyType({
    **TRAINING_FLAGS,
    "target_length": "TARGET_LENGTH",
    "seq_length": "SEQ_LENGTH",
    "original_length": "ORIGINAL_LENGTH",
    "pi_factor": "PI_FACTOR",
})
#: The planner's (``endprompt-plan``): ``L0`` is the model's window, from its preset or config.
PLAN_FLAGS: Mapping[str, str] = MappingProxyType({
    **PREPROCESS_FLAGS,
    "original_length": "--model / --hf-config (its max_position_embeddings)",
})
EXPORT_FLAGS: Mapping[str, str] = MappingProxyType({
    **TRAINING_FLAGS,
    "target_length": "--target-length",
    "pi_factor": "--pi-factor",
    "original_length": "the checkpoint's max_position_embeddings",
})


def explicit_pi_factor(pi_factor: float | None, megatron_pi_factor: float | None,
                       flags: Mapping[str, str]) -> float | None:
    """The ``s`` the user set through either flag (``None``: neither); ``ValueError`` when both
    are set and differ, or ``s < 1``."""
    if megatron_pi_factor in (None, 1.0):
        megatron_pi_factor = None
    if pi_factor is None:
        pi_factor = megatron_pi_factor
    elif megatron_pi_factor is not None and float(megatron_pi_factor) != float(pi_factor):
        raise ValueError(
            f"PI factor s={pi_factor:g} ({flags['pi_factor']}) disagrees with Megatron's "
            f"{flags['megatron_pi_factor']} {megatron_pi_factor:g}; both mean 'divide positions "
            "by s': set one of them")
    if pi_factor is not None and not (math.isfinite(float(pi_factor)) and float(pi_factor) >= 1.0):
        raise ValueError(f"PI factor s={pi_factor:g} must be finite and >= 1 "
                         f"({flags['pi_factor']})")
    return None if pi_factor is None else float(pi_factor)


def resolve_pi_factor(pi_factor: float | None, megatron_pi_factor: float | None, *,
                      flags: Mapping[str, str] = TRAINING_FLAGS) -> float:
    """``s`` from EndPrompt's PI factor and Megatron's ``seq_len_interpolation_factor`` (the same
    thing: divide positions by ``s``). Either may be given, both only when equal; neither -> 1.
    Raises ``ValueError`` naming the flags."""
    s = explicit_pi_factor(pi_factor, megatron_pi_factor, flags)
    return 1.0 if s is None else s


@dataclass(frozen=True, kw_only=True)
class EndPromptWindow:
    """The trained-for window of one run; validated on construction (``ValueError`` naming the
    flag; the training start-up, :mod:`megatron_endprompt.training.run`, turns it into
    :class:`UserError`)."""

    target_length: int
    """``L``: the context window being trained for; every position id is ``< L``; ``>= L0``."""

    seq_length: int | None = None
    """``P``: physical sample length (``--seq-length``); ``None`` where irrelevant (export)."""

    original_length: int | None = None
    """``L0``: the model's original window; ``None`` only before a model is known
    (preprocessing), which leaves ``pi_factor`` unresolved too."""

    pi_factor: float | None = None
    """``s``: RoPE positions are divided by ``s``; ``None`` -> ``ceil(L / L0)`` once ``L0`` is
    known. Always ``>= 1`` after construction when ``L0`` is given."""

    loss_weights: LossWeights = field(default_factory=LossWeights)
    """The run's overrides of the sidecar's loss weights (a ``None`` field keeps the
    sidecar's)."""

    original_length_from: str = field(default="", compare=False)
    """Where ``L0`` came from, for the start-up banner (e.g. ``--max-position-embeddings``)."""

    flags: Mapping[str, str] = field(default=TRAINING_FLAGS, compare=False, repr=False)
    """Flag spellings of the tool that built the window (``TRAINING_FLAGS``, ...)."""

    def __post_init__(self) -> None:
        f, L, P, L0 = self.flags, self.target_length, self.seq_length, self.original_length
        if P is not None and P < 2:
            raise ValueError(f"seq length P={P} must be >= 2 ({f['seq_length']})")
        if L > MAX_POSITION:
            raise ValueError(
                f"target length L={L} exceeds {MAX_POSITION:,}, the largest position an int32 "
                f"record holds ({f['target_length']})")
        if P is not None and not L > P:
            raise ValueError(
                f"target length L={L} must be larger than seq length P={P}; raise "
                f"{f['target_length']} or lower {f['seq_length']}")
        if L0 is not None:
            if L0 < 1:
                raise ValueError(f"original window L0={L0} must be >= 1 ({f['original_length']})")
            if L < L0:  # L == L0 is legal: s = 1, training at the model's own window
                source = f", from {self.original_length_from}" if self.original_length_from \
                    else ""
                raise ValueError(
                    f"target length L={L} ({f['target_length']}) is below the original "
                    f"context window {L0} (L0{source}); raise {f['target_length']} to {L0} or "
                    f"more (L = L0 trains at the model's own window, s = 1) or set "
                    f"{f['original_length']} to the model's original window")
            s = self.pi_factor if self.pi_factor is not None else math.ceil(L / L0)
            object.__setattr__(self, "pi_factor", resolve_pi_factor(s, None, flags=f))
        elif self.pi_factor is not None:
            object.__setattr__(self, "pi_factor", resolve_pi_factor(self.pi_factor, None,
                                                                    flags=f))

    @property
    def positions_fit(self) -> bool:
        """Whether linear PI keeps every position inside the original window: ``s * L0 >= L``
        (``L / s <= L0``). The trainer accepts a smaller ``s``; the launcher and the export
        refuse it, both through this one rule."""
        return self.pi_factor * self.original_length >= self.target_length

    def banner(self) -> str:
        """One start-up line: ``L``, ``L0`` (and where it came from), ``s``."""
        source = f" ({self.original_length_from})" if self.original_length_from else ""
        return f"L={self.target_length} L0={self.original_length}{source} s={self.pi_factor:g}"
