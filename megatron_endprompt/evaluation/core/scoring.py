"""Scores: passkey exact match, RULER's ``string_match_all``, accuracy and perplexity
aggregation."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = ["parse_first_integer", "passkey_exact", "string_match_all", "string_match_part",
           "ruler_postprocess", "score",
           "mean_score", "PerplexityStats", "aggregate_perplexity", "METRICS", "Scorer"]

_INT = re.compile(r"\d+")
_NONPRINT = re.compile(r"[\x00-\x1f]")


def parse_first_integer(text: str) -> int | None:
    """The first run of digits in ``text`` as an int (``None`` if there is none)."""
    m = _INT.search(text)
    return int(m.group()) if m else None


def passkey_exact(prediction: str, answer: str) -> float:
    """1.0 when the first integer of ``prediction`` equals the pass key, else 0.0."""
    got = parse_first_integer(prediction)
    return 1.0 if got is not None and got == int(answer) else 0.0


def ruler_postprocess(prediction: str) -> str:
    """RULER ``scripts/eval/evaluate.py`` ``postprocess_pred``: strip, control characters
    (``[\\x00-\\x1f]``) become newlines, strip again."""
    return _NONPRINT.sub("\n", prediction.strip()).strip()


_clean = ruler_postprocess


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """RULER ``scripts/eval/synthetic/constants.py`` ``string_match_all`` for one prediction:
    the fraction of ``references`` contained (case-insensitively) in it. RULER's task score is
    the mean over predictions x 100, rounded to 2 decimals."""
    if not references:
        raise ValueError("string_match_all needs at least one reference")
    pred = _clean(prediction).lower()
    return sum(1.0 for r in references if r.lower() in pred) / len(references)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """RULER ``string_match_part`` for one prediction: 1.0 when any reference is contained
    (case-insensitively) in it (RULER's QA metric)."""
    if not references:
        raise ValueError("string_match_part needs at least one reference")
    pred = _clean(prediction).lower()
    return max(1.0 if r.lower() in pred else 0.0 for r in references)


#: ``scorer(prediction, references) -> score in [0, 1]``: one prediction against its references.
Scorer = Callable[[str, Sequence[str]], float]

METRICS: dict[str, Scorer] = {
    "passkey_exact": lambda pred, refs: passkey_exact(pred, refs[0]),
    "string_match_all": string_match_all, "string_match_part": string_match_part}


def score(metric: str, prediction: str, references: Sequence[str]) -> float:
    """Score one prediction with ``metric`` (a key of :data:`METRICS`)."""
    try:
        fn = METRICS[metric]
    except KeyError:
        raise ValueError(f"unknown metric {metric!r}; one of {sorted(METRICS)}") from None
    return float(fn(prediction, references))


def mean_score(scores: Iterable[float]) -> float | None:
    """Mean of ``scores`` (``None`` for none): accuracy over samples, as RULER averages
    ``string_match_all`` over predictions."""
    vals = list(scores)
    return sum(vals) / len(vals) if vals else None


@dataclass(kw_only=True)
class PerplexityStats:
    """Summed token negative log-likelihood (nats) over ``tokens`` scored tokens in
    ``windows`` windows."""

    nll_sum: float = 0.0
    tokens: int = 0
    windows: int = 0

    def add(self, *, nll_sum: float, tokens: int, windows: int = 1) -> None:
        """Accumulate one or more windows."""
        self.nll_sum += float(nll_sum)
        self.tokens += int(tokens)
        self.windows += int(windows)

    @property
    def mean_nll(self) -> float:
        """Token-level mean NLL."""
        if self.tokens == 0:
            raise ValueError("no token scored")
        return self.nll_sum / self.tokens

    @property
    def ppl(self) -> float:
        """``exp(mean NLL)`` (``inf`` on overflow)."""
        try:
            return math.exp(self.mean_nll)
        except OverflowError:
            return math.inf

    def as_dict(self) -> dict[str, float | int]:
        """JSON form (``ppl`` is ``None`` when it overflows)."""
        ppl = self.ppl
        return {"ppl": ppl if math.isfinite(ppl) else None, "nll": self.mean_nll,
                "tokens": self.tokens,
                "windows": self.windows}


def aggregate_perplexity(window_nll_sums: Sequence[float],
                         window_tokens: Sequence[int]) -> PerplexityStats:
    """Token-level perplexity of several windows: ``exp(sum NLL / sum tokens)``."""
    if len(window_nll_sums) != len(window_tokens):
        raise ValueError("one token count per window")
    stats = PerplexityStats()
    for s, n in zip(window_nll_sums, window_tokens, strict=True):
        stats.add(nll_sum=s, tokens=n)
    return stats
