"""The layout-coverage line: how much of an EndPrompt prefix is EndPrompt training.

A ``document-tail`` layout on short documents packs most samples with contiguous positions (no
jump: plain short training) and leaves the tokens between a document's context and its tail
unused; on web data at ``P = 8K`` that can be most of the run. The preprocessing stats recorded
in each sidecar header (``stats``: ``samples_written``, ``samples_contiguous_positions``,
``tokens_in``, ``tokens_unused_middle``, ``tokens_left_over_at_end``, and for PoSE's law
``tokens_in_dropped_documents``) give both shares. This is
the one owner of the line: the text summaries of preprocessing and of the sidecar tool (their
summary dicts carry the same keys) and the training start-up print it, not only
``--summary-json``.
"""

from __future__ import annotations

__all__ = ["coverage_line"]


def coverage_line(prefix: str, stats: dict) -> str | None:
    """``PREFIX: 61.0% of 478 samples have a position jump, 13.0% of 1,234,567 tokens used``,
    or ``None`` when the sidecar records no stats (built by an older version)."""
    samples = stats.get("samples_written")
    tokens = stats.get("tokens_in")
    if not samples or not tokens:
        return None
    jumped = 1 - stats.get("samples_contiguous_positions", 0) / samples
    unused = stats.get("tokens_unused_middle", 0) + stats.get("tokens_left_over_at_end", 0) \
        + stats.get("tokens_in_dropped_documents", 0)
    used = max(0.0, 1 - unused / tokens)
    line = (f"{prefix}: {100 * jumped:.1f}% of {samples:,} samples have a position jump, "
            f"{100 * used:.1f}% of {tokens:,} tokens used")
    if jumped < 0.5:
        line += " (most samples are plain short training: longer documents or another " \
                "--terminal-source give more EndPrompt samples)"
    return line
