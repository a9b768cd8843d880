"""The terminal of every sample: where its last tokens come from, how many, and the seed of the
per-sample draws — one frozen :class:`TerminalSpec`, defined and validated here once for
preprocessing, sidecar building and the CLIs; :func:`check_source`/:func:`check_seed` are the same
rules for a value read from a sidecar header.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_endprompt.layout import LayoutConfig
from megatron_endprompt.pose_law import check_pose_terminal

TERMINAL_SOURCES: tuple[str, ...] = ("continuation", "document-tail", "prompt")
"""``--terminal-source`` choices (see :mod:`~megatron_endprompt.data.prepare.samples`)."""

SEED_LIMIT = 2**63
"""Seeds are in ``[0, 2**63)``: numpy seeds are non-negative and the header stores an int64."""


def check_source(source) -> None:
    """``ValueError`` unless ``source`` is one of :data:`TERMINAL_SOURCES`."""
    if source not in TERMINAL_SOURCES:
        raise ValueError(f"--terminal-source must be one of {', '.join(TERMINAL_SOURCES)}")


def check_seed(seed) -> None:
    """``ValueError`` unless ``seed`` is in ``[0, 2**63)``."""
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"--seed {seed} must be in [0, 2**63)")


@dataclass(frozen=True, kw_only=True)
class TerminalSpec:
    """The ``--terminal-*`` and ``--seed`` flags, checked on construction (``ValueError``)."""

    source: str = "continuation"
    """``--terminal-source``: continuation | document-tail | prompt."""
    prompts: str | None = None
    """``--terminal-prompts``: a built-in set name (``ep1``, ``ep1-3``) or a file with one prompt
    per line (``None``: ``ep1``, EP1 alone); used by ``prompt`` only."""
    length: int | None = None
    """``--terminal-length``: ``b`` (continuation / document-tail); ``None`` for prompts (each
    prompt's own length)."""
    seed: int = 1234
    """``--seed``: per-sample layouts (and prompts) come from ``(seed, partition, sample)``."""

    def __post_init__(self) -> None:
        check_source(self.source)
        if self.source == "prompt":
            object.__setattr__(self, "length", None)
        elif self.prompts is not None:  # would be silently ignored
            raise ValueError(f"--terminal-prompts {self.prompts} is used only with "
                             f"--terminal-source prompt (not {self.source}); add "
                             "--terminal-source prompt or drop --terminal-prompts")
        elif self.length is None:
            raise ValueError(f"--terminal-source {self.source} needs --terminal-length")
        check_seed(self.seed)

    @property
    def is_prompt(self) -> bool:
        """Prompt terminals (tokenized prompt + EOD) rather than corpus tokens."""
        return self.source == "prompt"

    def check(self, layout: LayoutConfig) -> None:
        """``ValueError`` when ``b`` does not fit ``layout`` (prompts are checked once
        tokenized), or the source does not suit its placement (``pose``)."""
        check_pose_terminal(layout, source=self.source, terminal_length=self.length)
        if self.length is not None:
            layout.check_terminal_length(self.length)
