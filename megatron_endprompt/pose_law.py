"""PoSE's sample law, as PoSE's own training code draws it: the ``pose`` placement.

Read (not copied) from ``dwzhu-pku/PoSE``, ``src/train_pose.py`` at commit
``a3d4ba8bd38e6615ba778d9a1061e380c8e69647``, function ``train_preprocess_function_pose``.
Per document, tokenized and truncated to ``5 x P`` tokens (``P``: the training window, PoSE's
``model_max_position_embeddings``; ``L``: the target window), with a text window of ``w``
tokens (PoSE: ``w = min(n, P)``):

* **first chunk**: tokens ``[0, r1)`` with ``r1 ~ U{1 .. ceil(w / 2)}``
  (``randint(1, (w + 1) // 2)``) at positions ``0 .. r1 - 1``;
* **text skip**: the second chunk is the ``w - r1`` tokens ending at ``r2 ~ U{w .. n}``, so
  ``l2 - r1 = r2 - w ~ U{0 .. n - w}`` tokens of the document between the chunks are unused;
* **position skip**: the second chunk starts at position ``r1 + k``, ``k ~ U{0 .. L - P}``
  (PoSE fixes the first chunk's offset at 0 and draws the second's in ``[0, L - P]``), so
  every position is ``<= L - 1``;
* **loss**: every next-token prediction, one weight.

Why a module of its own: the law is the same for the two layouts built on it, and the sidecar
checks, the sample maker and the benchmark's row (e) read it from here:

* ``--placement pose --terminal-source continuation`` (PoSE itself): ``w = P``; the last
  ``b`` inputs of the second chunk are the "terminal" (they continue it: same skip), record
  ``[a = P - b, T = a + k, r1, r1 + k]``; with the default weight 1 the loss is uniform.
* ``--placement pose --terminal-source prompt`` (ET(PoSE) with PoSE's law): the context is
  PoSE's two chunks over ``w = a = P - b`` tokens, then the prompt at ``T = L - b`` (the
  paper's terminal at the end of the window), record ``[a, L - b, r1, r1 + k]``; the skip
  budget ``L - P`` is exactly ``T - a``, so every context position stays below ``T``.

Forced by the project's fixed ``P + 1``-token samples: ``n`` counts a document's tokens
except its last (its EOD with ``--append-eod``), which a continuation sample may take as the
label after its last input; documents whose ``n`` is below the window are dropped and counted
(PoSE trains them as shorter samples). A document-tail terminal is refused: PoSE's second
chunk already is a piece of the document's later text.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from megatron_endprompt.layout import LayoutConfig

#: The source read, as cited above (stored in the sidecar's stats).
LAW = "dwzhu-pku/PoSE src/train_pose.py@a3d4ba8bd38e6615ba778d9a1061e380c8e69647"

#: PoSE truncates each document to this many training windows (``max_length = 5 x P``).
TRUNCATE_WINDOWS = 5

#: The terminal sources the ``pose`` placement takes.
POSE_SOURCES: tuple[str, ...] = ("continuation", "prompt")


@dataclass(frozen=True, kw_only=True)
class PoseDraw:
    """One document's PoSE sample, in document token offsets."""

    r1: int
    """First chunk: tokens ``[0, r1)`` at positions ``0 .. r1 - 1``."""
    l2: int
    """Second chunk's first token (``l2 - r1`` tokens of text skipped)."""
    r2: int
    """Second chunk's end (exclusive); a continuation sample's final label is token ``r2``."""
    k: int
    """Position skip: the second chunk starts at position ``r1 + k``."""


def usable_tokens(text_tokens: int, seq_length: int) -> int:
    """``n``: the document's text tokens PoSE draws from (truncated to ``5 x P``)."""
    return min(text_tokens, TRUNCATE_WINDOWS * seq_length)


def draw(rng: np.random.Generator, *, text_tokens: int, window: int, seq_length: int,
         target_length: int) -> PoseDraw:
    """PoSE's law (module docstring) for a document of ``text_tokens`` tokens and a text
    window of ``window`` tokens (``P``, or the context ``a`` before a prompt); the document
    must hold the window (``usable_tokens >= window``)."""
    n = usable_tokens(text_tokens, seq_length)
    if n < window:
        raise ValueError(f"a document of {text_tokens} tokens cannot hold a PoSE window of "
                         f"{window}")
    r1 = int(rng.integers(1, (window + 1) // 2, endpoint=True))
    r2 = int(rng.integers(window, n, endpoint=True))
    k = int(rng.integers(0, target_length - seq_length, endpoint=True))
    return PoseDraw(r1=r1, l2=r2 - (window - r1), r2=r2, k=k)


def pose_record(d: PoseDraw, layout: LayoutConfig, *, terminal_length: int,
                prompt: bool) -> np.ndarray:
    """The int32 record ``[a, T, r1, r1 + k]`` of a draw: ``T = a + k`` for a continuation
    terminal (it continues the second chunk), ``T = L - b`` for a prompt."""
    a = layout.seq_length - terminal_length
    T = layout.target_length - terminal_length if prompt else a + d.k
    return np.array([a, T, d.r1, d.r1 + d.k], dtype=np.int32)


def check_pose_terminal(layout: LayoutConfig, *, source: str,
                        terminal_length: int | None) -> None:
    """``ValueError`` (one line: the flag and the fix) unless ``source`` and ``b`` suit the
    ``pose`` placement; nothing for the other placements."""
    if layout.placement != "pose":
        return
    if source not in POSE_SOURCES:
        raise ValueError(
            f"--placement pose takes --terminal-source continuation (PoSE itself) or prompt "
            f"(ET(PoSE)), not {source} (PoSE's second chunk already is the document's later "
            "text); use one of those, or --placement random --pose-chunks 2 for the "
            "project's two-piece context before a document tail")
    P = layout.seq_length
    if source == "continuation" and terminal_length is not None:
        most = P - 1 - (P + 1) // 2
        if terminal_length > most:
            raise ValueError(
                f"--terminal-length {terminal_length}: --placement pose draws a first chunk of "
                f"up to ceil(P/2) = {(P + 1) // 2} tokens, which must end inside the context "
                f"a = P - b; use --terminal-length <= {most} (1 is PoSE itself)")


def check_pose_records(records: np.ndarray, layout: LayoutConfig,
                       terminal_length: int | None) -> list[tuple[np.ndarray, str]]:
    """``(ok [n], reason)`` checks a ``pose`` record must pass beyond the two-piece ones:
    first chunk in ``[1, ceil(w / 2)]``, position skip in ``[0, L - P]``, and the terminal
    where its source puts it (``terminal_length`` is ``None`` exactly for prompts)."""
    P, L = layout.seq_length, layout.target_length
    rec = np.asarray(records, dtype=np.int64)
    a, T, r1, k = rec[:, 0], rec[:, 1], rec[:, 2], rec[:, 3] - rec[:, 2]
    prompt = terminal_length is None
    window = a if prompt else np.full_like(a, P)
    want_T = L - (P - a) if prompt else a + k
    where = "at L - b (prompt)" if prompt else "at a + skip (continuing the second chunk)"
    return [((r1 >= 1) & (r1 <= (window + 1) // 2), "PoSE first chunk outside [1, ceil(w/2)]"),
            ((k >= 0) & (k <= L - P), f"PoSE position skip outside [0, L-P={L - P}]"),
            (T == want_T, f"PoSE terminal not {where}")]
