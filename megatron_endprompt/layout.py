"""EndPrompt sample layouts: position ids and loss weights for one physical sample.

A sample is ``P`` input tokens: ``a`` context tokens followed by ``b`` terminal tokens
(``a + b = P``). Text stays contiguous; only the positions jump:

* context tokens get positions ``0..a-1`` — or, with ET(PoSE), ``N`` contiguous pieces
  separated by random skips, every position still below the terminal start ``T``;
* terminal tokens get ``T..T+b-1`` where ``T = L - b`` (``fixed``) or ``T`` is drawn uniformly
  from ``[a, L - b]`` (``random``);
* ``pose``: PoSE's own law, one sample per document, two context pieces with a text skip
  between them (:mod:`megatron_endprompt.pose_law`, which draws those records: they need the
  document, so :func:`make_record` does not).

A layout is stored compactly as a *record* of ``2 * N`` int32 values (``N`` = number of
context pieces, 1 without PoSE)::

    [a, T, c_1 .. c_{N-1}, q_1 .. q_{N-1}]

where piece ``j >= 1`` starts at token offset ``c_j`` with position ``q_j`` (piece 0 starts at
token 0, position 0). Everything a trainer needs — ``position_ids`` and ``loss_mask`` — is
derived from the record in O(N) vector operations, so a sidecar holds a handful of integers
per sample instead of a per-token array.

Loss weights are assigned by the *label* being predicted: ``loss_mask[i]`` weights the
prediction of token ``i + 1``. Predictions of context tokens (``i < a - 1``) get
the context weight; predictions of terminal tokens, the first one included, get
the terminal weight ``w`` (:class:`~megatron_endprompt.loss_weights.LossWeights`). The prediction of
the label token after the sample gets it too — except for a *prompt* terminal
(``predict_after_terminal=False``), where it gets 0: the paper's objective has no prediction after
the last prompt token (the text does not continue the prompt).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from megatron_endprompt.loss_weights import LossWeights
from megatron_endprompt.window import PREPROCESS_FLAGS, EndPromptWindow

Placement = Literal["fixed", "random", "pose"]
PLACEMENTS: tuple[str, ...] = ("fixed", "random", "pose")
#: The keys of a sidecar header's ``layout`` object (:meth:`LayoutConfig.to_header`).
LAYOUT_HEADER_KEYS: tuple[str, ...] = ("seq_length", "target_length", "placement", "pose_chunks",
                                       "terminal_loss_weight", "context_loss_weight")


@dataclass(frozen=True, kw_only=True)
class LayoutConfig:
    """Parameters shared by every sample of a dataset; validated on construction."""

    seq_length: int
    """``P``: physical input length of a sample (Megatron's ``--seq-length``)."""

    target_length: int
    """``L``: the context window being trained for; every position id is ``< L``."""

    placement: Placement = "fixed"
    """``fixed``: terminal at ``L-b..L-1``; ``random``: terminal start uniform in ``[a, L-b]``;
    ``pose``: PoSE's law (:mod:`megatron_endprompt.pose_law`)."""

    pose_chunks: int = 1
    """``N``: context pieces with random skips between them (ET(PoSE)); 1 disables PoSE; 2
    for ``pose`` (PoSE's two chunks)."""

    loss_weights: LossWeights = field(default_factory=lambda: LossWeights(
        terminal=1.0, context=1.0, flags=PREPROCESS_FLAGS))
    """Terminal weight ``w`` (the paper uses a small ``w`` for prompts) and context weight (1
    keeps ordinary LM loss, 0 trains terminals only); both set."""

    def __post_init__(self) -> None:
        # P and L are validated by the one owner of the window, the weights by LossWeights.
        EndPromptWindow(seq_length=self.seq_length, target_length=self.target_length,
                        flags=PREPROCESS_FLAGS)
        if not self.loss_weights.complete:
            raise ValueError(f"a layout needs both loss weights, got {self.loss_weights}")
        if self.placement not in PLACEMENTS:
            raise ValueError(
                f"placement {self.placement!r} unknown; use --placement {' or '.join(PLACEMENTS)}"
            )
        if self.pose_chunks < 1:
            raise ValueError(
                f"pose chunks N={self.pose_chunks} must be >= 1 (1 disables PoSE; --pose-chunks)"
            )
        if self.placement == "pose" and self.pose_chunks != 2:
            raise ValueError(f"--placement pose draws PoSE's two chunks; drop --pose-chunks "
                             f"{self.pose_chunks} (or give 2)")

    def to_header(self) -> dict:
        """The sidecar header's ``layout`` object: flat, the weights as ``terminal_loss_weight``
        and ``context_loss_weight`` (the on-disk format)."""
        return {"seq_length": self.seq_length, "target_length": self.target_length,
                "placement": self.placement, "pose_chunks": self.pose_chunks,
                "terminal_loss_weight": self.loss_weights.terminal,
                "context_loss_weight": self.loss_weights.context}

    @classmethod
    def from_header(cls, layout: dict) -> LayoutConfig:
        """The inverse of :meth:`to_header` (``ValueError`` on bad values)."""
        return cls(seq_length=layout["seq_length"], target_length=layout["target_length"],
                   placement=layout["placement"], pose_chunks=layout["pose_chunks"],
                   loss_weights=LossWeights(terminal=layout["terminal_loss_weight"],
                                            context=layout["context_loss_weight"],
                                            flags=PREPROCESS_FLAGS))

    @property
    def record_width(self) -> int:
        """Number of int32 values in one sample's record."""
        return 2 * self.pose_chunks

    def check_terminal_length(self, terminal_length: int) -> None:
        """Raise ``ValueError`` unless a terminal of ``terminal_length`` tokens fits a sample."""
        b = terminal_length
        if b < 1:
            raise ValueError(f"terminal length b={b} must be >= 1 (--terminal-length)")
        if b >= self.seq_length:
            raise ValueError(
                f"terminal length b={b} must be smaller than seq length P={self.seq_length} "
                "(lower --terminal-length, use shorter --terminal-prompts, or raise --seq-length)"
            )
        a = self.seq_length - b
        if self.pose_chunks > a:
            raise ValueError(
                f"--pose-chunks {self.pose_chunks} cannot split a context of a={a} tokens; "
                f"use at most {a} chunks or a shorter terminal"
            )


def sample_rng(seed: int, sample_index: int) -> np.random.Generator:
    """Generator for one sample: the layout depends on ``(seed, index)`` only, not on workers."""
    return np.random.default_rng((seed, sample_index))


def make_record(
    config: LayoutConfig, *, terminal_length: int, rng: np.random.Generator
) -> np.ndarray:
    """Draw one sample's layout; returns the int32 record ``[2 * N]`` described above."""
    config.check_terminal_length(terminal_length)
    if config.placement == "pose":
        raise ValueError("pose records are drawn per document by "
                         "megatron_endprompt.pose_law, not by make_record")
    P, L, N, b = config.seq_length, config.target_length, config.pose_chunks, terminal_length
    a = P - b
    if config.placement == "fixed":
        T = L - b
    else:
        T = int(rng.integers(a, L - b, endpoint=True))
    record = np.empty(2 * N, dtype=np.int32)
    record[0], record[1] = a, T
    if N > 1:
        # Piece boundaries: N-1 distinct cut points in [1, a-1], every piece non-empty.
        cuts = np.sort(rng.choice(a - 1, size=N - 1, replace=False)) + 1
        # Skip-bias sampling (PoSE): cumulative skips are sorted uniform draws from the
        # budget T - a, so positions stay increasing and the last context position < T.
        skips = np.sort(rng.integers(0, T - a, size=N - 1, endpoint=True))
        record[2 : N + 1] = cuts
        record[N + 1 :] = cuts + skips
    return record


def context_length(record: np.ndarray) -> int:
    """``a``, the context length of one sample's record (its first value)."""
    return int(record[0])


def context_lengths(records: np.ndarray) -> np.ndarray:
    """``a`` of each row of ``records [S, 2N]`` (int64): the column :func:`context_length` reads."""
    return np.asarray(records)[:, 0].astype(np.int64)


def record_runs(record: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token offsets ``[R]`` and start positions ``[R]`` of the ``R = N + 1`` contiguous runs."""
    n = len(record) // 2
    offsets = np.empty(n + 1, dtype=np.int64)
    starts = np.empty(n + 1, dtype=np.int64)
    offsets[0] = starts[0] = 0
    offsets[1:n] = record[2 : n + 1]
    starts[1:n] = record[n + 1 :]
    offsets[n], starts[n] = record[0], record[1]
    return offsets, starts


@functools.lru_cache(maxsize=8)
def _arange(n: int) -> np.ndarray:
    """Read-only ``arange(n)`` int64: copying it is cheaper than building it per sample."""
    out = np.arange(n, dtype=np.int64)
    out.flags.writeable = False
    return out


def positions_from_record(record: np.ndarray, seq_length: int) -> np.ndarray:
    """Position ids ``[P]`` (int64) of one sample."""
    rec = np.asarray(record).tolist()  # plain ints: scalar ops beat numpy calls here
    n = len(rec) // 2
    # Runs after piece 0 (which keeps positions 0..): PoSE pieces 1..N-1, then the terminal.
    offsets = rec[2 : n + 1] + [rec[0]]
    starts = rec[n + 1 :] + [rec[1]]
    ends = offsets[1:] + [seq_length]
    positions = _arange(seq_length).copy()
    for offset, start, end in zip(offsets, starts, ends):
        if start != offset:
            positions[offset:end] += start - offset
    return positions


def loss_weights_from_record(
    record: np.ndarray, seq_length: int, weights: LossWeights, *,
    predict_after_terminal: bool = True,
) -> np.ndarray:
    """Loss weights ``[P]`` (float32): ``[i]`` weights the prediction of token ``i + 1``;
    ``predict_after_terminal=False`` (prompt terminals) sets ``[P - 1]``, the prediction after
    the terminal's last token, to 0."""
    out = np.full(seq_length, weights.context, dtype=np.float32)
    out[context_length(record) - 1 :] = weights.terminal
    if not predict_after_terminal:
        out[-1] = 0.0
    return out


def describe_runs(record: np.ndarray, seq_length: int) -> list[tuple[int, int, int]]:
    """``[(token_offset, first_position, length), ...]`` — the layout in human terms."""
    offsets, starts = record_runs(record)
    ends = np.append(offsets[1:], seq_length)
    return [(int(o), int(s), int(e - o)) for o, s, e in zip(offsets, starts, ends)]
