"""The EndPrompt loss weights — the terminal weight ``w`` and the context weight — as one value,
validated on construction and nowhere else.

Preprocessing records them in the sidecar header (its ``layout``); training may override either
(``--endprompt-terminal-loss-weight`` / ``--endprompt-context-loss-weight``); the layout, the
window, the dataset config and the header all hold a :class:`LossWeights`. Imports nothing of
the package, so every stage may use it.

Defaults: ``w = 0.1`` for prompt terminals (small and non-zero, as the paper asks; it states no
value), ``1.0`` for corpus terminals; context weight ``1.0`` (ordinary LM loss on the context).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import InitVar, dataclass
from types import MappingProxyType

__all__ = ["DEFAULT_PROMPT_TERMINAL_WEIGHT", "LossWeights"]

DEFAULT_PROMPT_TERMINAL_WEIGHT = 0.1
"""``w`` of prompt terminals when none is given: small and non-zero, as the paper asks."""

#: Training's flag spellings (error messages name the flag); tools pass their own.
_TRAINING_FLAGS: Mapping[str, str] = MappingProxyType({
    "terminal_loss_weight": "--endprompt-terminal-loss-weight",
    "context_loss_weight": "--endprompt-context-loss-weight",
})


@dataclass(frozen=True, kw_only=True)
class LossWeights:
    """Loss weights of one layout, or a run's overrides of them; ``ValueError`` naming the flag
    on construction unless ``terminal > 0`` and ``context >= 0`` (both finite)."""

    terminal: float | None = None
    """``w > 0``: weight of the terminal predictions (``i >= a - 1``); ``None``: not set (an
    override that keeps the sidecar's)."""

    context: float | None = None
    """``>= 0``: weight of the context predictions (``i < a - 1``); 0 trains terminals only;
    ``None``: not set."""

    flags: InitVar[Mapping[str, str] | None] = None
    """The flags the values came from (``terminal_loss_weight``/``context_loss_weight`` keys),
    named by the errors; training's when ``None``. Not stored (the value stays picklable)."""

    def __post_init__(self, flags: Mapping[str, str] | None) -> None:
        flags = _TRAINING_FLAGS if flags is None else flags
        w, cw = self.terminal, self.context
        if w is not None and not (_real(w) and w > 0):
            raise ValueError(f"terminal loss weight w={w} must be finite and > 0 "
                             f"({flags['terminal_loss_weight']}; the paper uses a small "
                             "non-zero w)")
        if cw is not None and not (_real(cw) and cw >= 0):
            raise ValueError(f"context loss weight {cw} must be finite and >= 0 "
                             f"({flags['context_loss_weight']})")
        for name in ("terminal", "context"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, float(value))

    @classmethod
    def for_source(cls, terminal_source: str, *, terminal: float | None = None,
                   context: float = 1.0, flags: Mapping[str, str] | None = None
                   ) -> LossWeights:
        """The weights preprocessing records: ``terminal`` as given, else
        :data:`DEFAULT_PROMPT_TERMINAL_WEIGHT` for prompt terminals and 1.0 for the others."""
        if terminal is None:
            terminal = DEFAULT_PROMPT_TERMINAL_WEIGHT if terminal_source == "prompt" else 1.0
        return cls(terminal=terminal, context=context, flags=flags)

    @property
    def complete(self) -> bool:
        """Both weights set (what a layout needs)."""
        return self.terminal is not None and self.context is not None

    def over(self, base: LossWeights) -> LossWeights:
        """``base`` with the weights set here replacing its own (training overrides over the
        sidecar's)."""
        return LossWeights(terminal=base.terminal if self.terminal is None else self.terminal,
                           context=base.context if self.context is None else self.context)

    def as_list(self) -> list[float | None]:
        """``[terminal, context]``, a JSON-able form (index-cache keys)."""
        return [self.terminal, self.context]


def _real(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
