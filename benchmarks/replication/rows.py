"""A replication row as data: what it trains on, how that data is laid out, its physical
sample length and its tokens per step, in one typed record per row.

Both protocols keep one table of :class:`RowSpec` (``protocol.ROWS``, ``extension.ROWS``);
their runners build, check and train a row from its record alone, so a row is added by adding
a record, not a branch.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Physical sample lengths a row may name: the short window ``P``, the target ``L``, or
#: (g1p)'s context length ``a = P - len(EP1)`` (its no-terminal twin (g1n)).
SEQ_LENGTHS = ("P", "L", "a")
#: How a row's plain (sidecar-free) data is cut into sequences.
PLAIN_KINDS = ("padded", "packed", "stream")


@dataclass(kw_only=True, frozen=True)
class RowSpec:
    """One row of a replication table."""

    key: str
    """Short name in tables and paired differences, e.g. ``d``."""
    label: str
    """What the row is, as the tables print it."""
    source: str | None = None
    """Training data: the documents' JSONL in the work directory (a sidecar row, preprocessed
    from it) or a plain prefix (``plain`` rows); ``None``: no training (PI only)."""
    layout: tuple[str, ...] | None = None
    """Preprocessing flags of a sidecar row, with ``{b}`` (terminal length), ``{w}`` (terminal
    loss weight) and ``{pw}`` (prompt terminal's loss weight) filled per run; ``None`` for a
    plain row."""
    plain: str | None = None
    """For a plain row, one of :data:`PLAIN_KINDS`: ``padded`` (one document per ``L``-token
    sequence, EOD padding masked), ``packed`` (a document stream in ``L``-token windows),
    ``stream`` (``P``-token windows of a stream, contiguous positions)."""
    seq: str = "P"
    """Physical sample length, one of :data:`SEQ_LENGTHS`."""
    equal_tokens: bool = False
    """Tokens per step of the ``P``-token rows: ``docs x P / L`` sequences of ``L`` tokens per
    step (else ``docs`` sequences of ``seq`` tokens)."""
    contiguous: bool = False
    """Records rewritten to ``T = a`` after preprocessing (no position jump)."""
    reconstruction: bool = False
    """Our reconstruction of a method with no official code path (tables say so)."""

    def __post_init__(self) -> None:
        if self.seq not in SEQ_LENGTHS:
            raise ValueError(f"row {self.key}: seq {self.seq!r} not in {SEQ_LENGTHS}")
        if self.plain is not None and self.plain not in PLAIN_KINDS:
            raise ValueError(f"row {self.key}: plain {self.plain!r} not in {PLAIN_KINDS}")
        if self.source is not None and (self.layout is None) == (self.plain is None):
            raise ValueError(f"row {self.key}: a trained row has a layout or is plain")

    @property
    def trains(self) -> bool:
        """Whether the row fine-tunes (PI only does not)."""
        return self.source is not None

    def flags(self, *, terminal: int, weight: float, prompt_weight: float) -> list[str]:
        """The preprocessing flags of this run (a sidecar row)."""
        if self.layout is None:
            raise ValueError(f"row {self.key} is not preprocessed with a layout")
        values = {"b": str(terminal), "w": f"{weight:g}", "pw": f"{prompt_weight:g}"}
        return [f.format(**values) for f in self.layout]

    def sequences_per_step(self, docs: int, *, P: int, L: int) -> int:
        """Sequences per optimizer step: ``docs``, or ``docs x P / L`` (at least one per rank
        of the two the runner uses) for an equal-tokens row."""
        return max(2, docs * P // L) if self.equal_tokens else docs
