"""Statistics of the mini-replication: Wilson intervals per cell, intervals across seeds, and
the per-method summary the tables and the figure read.

A *cell* is (method, task, length): ``k`` prompts retrieved of ``n``. Per seed: the Wilson 95%
score interval of ``k / n`` (prompts as Bernoulli trials). Across seeds two intervals, both
kept: the Student-t 95% interval of the per-seed accuracies (``mean +- t(0.975, S-1) * sd /
sqrt(S)``: the fine-tuning seed's variation; the prompts are the same in every seed) and the
Wilson interval of the pooled counts (``sum k / sum n``; treats the ``S x n`` answers as
independent, which they are not quite: the same prompts are asked of every seed). The tables
show the t interval where there are at least 2 seeds, else the single run's Wilson interval.

Quantiles and tests come from SciPy (``scipy.stats.t``), for any number of seeds. A paired
difference carries its two-sided one-sample t-test p-value (``H0``: mean difference 0); a
table of differences is corrected as one family by Holm's step-down method
(:func:`holm`): a cell is *resolved* only where its Holm-adjusted p is below 0.05.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats as sps

Z95 = 1.959963984540054
#: Family-wise error rate of Holm's correction (and the two-sided level of every interval).
ALPHA = 0.05


def t975(df: int) -> float:
    """Student t quantile ``t(0.975, df)`` (SciPy), for any ``df >= 1``."""
    return float(sps.t.ppf(1 - ALPHA / 2, df))


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    s = len(values)
    mean = sum(values) / s
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (s - 1))


def wilson(k: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of ``k`` successes in ``n`` trials, as fractions."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def t_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """95% Student-t interval of the mean of ``values`` (clipped to [0, 1]); ``None`` for
    fewer than 2 values."""
    s = len(values)
    if s < 2:
        return None
    mean, sd = _mean_sd(values)
    half = t975(s - 1) * sd / math.sqrt(s)
    return (max(0.0, mean - half), min(1.0, mean + half))


def counts(eval_json: dict, task: str) -> dict[str, tuple[float, int]]:
    """``{length: (k, n)}`` of one task from the evaluator's JSON (its per-sample scores)."""
    out: dict[str, tuple[float, int]] = {}
    for s in eval_json.get("tasks", {}).get(task, {}).get("samples", []):
        k, n = out.get(str(s["length"]), (0.0, 0))
        out[str(s["length"])] = (k + float(s["score"] or 0.0), n + 1)
    return out


def cell(per_seed: Sequence[tuple[float, int]]) -> dict:
    """Summary of one cell over seeds: mean accuracy, its intervals, pooled counts."""
    accs = [k / n for k, n in per_seed if n]
    k_all, n_all = sum(k for k, _ in per_seed), sum(n for _, n in per_seed)
    mean = sum(accs) / len(accs) if accs else None
    t = t_interval(accs)
    pooled = wilson(k_all, n_all)
    return {"mean": mean, "per_seed": accs, "k": k_all, "n": n_all,
            "t95": list(t) if t else None, "wilson_pooled": list(pooled),
            "wilson_per_seed": [list(wilson(k, n)) for k, n in per_seed],
            "shown": list(t) if t else list(pooled)}


def summarize(runs: dict[str, dict], tasks: Sequence[str]) -> dict:
    """``runs``: ``{seed: {"counts": {task: {length: [k, n]}}, "ppl": {length: x}}}`` of one
    method -> ``{task: {length: cell}, "ppl": {length: {"mean", "min", "max"}}}``."""
    out: dict = {}
    for task in tasks:
        lengths = sorted({n for r in runs.values() for n in r["counts"].get(task, {})}, key=int)
        out[task] = {n: cell([tuple(r["counts"][task][n]) for r in runs.values()
                              if n in r["counts"].get(task, {})]) for n in lengths}
    ppl: dict = {}
    for r in runs.values():
        for n, v in (r.get("ppl") or {}).items():
            if v is not None:
                ppl.setdefault(n, []).append(v)
    out["ppl"] = {n: {"mean": sum(v) / len(v), "min": min(v), "max": max(v)}
                  for n, v in sorted(ppl.items(), key=lambda kv: int(kv[0]))}
    return out


def fmt_cell(c: dict | None) -> str:
    """``87 [80-92]`` in percent."""
    if not c or c.get("mean") is None:
        return "n/a"
    lo, hi = c["shown"]
    return f"{100 * c['mean']:.0f} [{100 * lo:.0f}-{100 * hi:.0f}]"


def paired_difference(x: dict[str, dict], y: dict[str, dict], task: str,
                      length: str) -> dict | None:
    """Accuracy difference ``x - y`` of one cell, paired by seed (both methods are evaluated
    on the same prompts per seed): :func:`paired_summary` of the per-seed differences. ``x``,
    ``y``: ``{seed: {"counts": {task: {length: [k, n]}}}}``; ``None`` without a shared seed."""
    diffs = []
    for seed in sorted(set(x) & set(y)):
        a = x[seed]["counts"].get(task, {}).get(length)
        b = y[seed]["counts"].get(task, {}).get(length)
        if a and b and a[1] and b[1]:
            diffs.append(a[0] / a[1] - b[0] / b[1])
    return paired_summary(diffs) if diffs else None


def paired_summary(diffs: Sequence[float]) -> dict:
    """Per-seed differences -> ``{"mean", "per_seed", "t95", "p"}``: the Student-t 95% interval
    of their mean (``t(0.975, S-1) * sd / sqrt(S)``, not clipped: a difference of retentions
    spans [-2, 2]) and the two-sided p of the paired t-test (``scipy.stats.ttest_1samp``
    against 0); ``t95`` and ``p`` are ``None`` for one seed. Identical differences (sd 0)
    give the degenerate interval ``[mean, mean]`` and p = 1 where the mean is 0, else 0."""
    diffs = [float(d) for d in diffs]
    s, mean = len(diffs), sum(diffs) / len(diffs)
    t = p = None
    if s >= 2:
        _, sd = _mean_sd(diffs)
        half = t975(s - 1) * sd / math.sqrt(s)
        t = [mean - half, mean + half]
        if sd == 0:
            p = 1.0 if mean == 0 else 0.0
        else:
            p = float(sps.ttest_1samp(diffs, 0.0).pvalue)
    return {"mean": mean, "per_seed": diffs, "t95": t, "p": p}


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values of one family (``None`` entries, cells without a
    test, are left out of the family and stay ``None``): sorted ascending, the ``i``-th
    (0-based) of ``m`` is ``min(1, max_{j <= i} (m - j) p_(j))``. A cell is resolved at
    family-wise level ``ALPHA`` where its adjusted p is below ``ALPHA``."""
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    order = sorted(idx, key=lambda i: pvalues[i])
    m, out, running = len(order), list[float | None]([None] * len(pvalues)), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        out[i] = running
    return out


def holm_family(cells: Sequence[dict]) -> None:
    """Add ``p_holm`` to each paired-difference cell of one table (one family), in place."""
    for c, adj in zip(cells, holm([c.get("p") for c in cells]), strict=True):
        c["p_holm"] = adj


def refresh_family(cells: Sequence[dict]) -> None:
    """Recompute each paired-difference cell of one table from its ``per_seed`` differences
    (interval, p) and add its Holm-adjusted p over the table, in place: a committed results
    JSON re-rendered gets today's statistics."""
    for c in cells:
        c.update(paired_summary(c["per_seed"]))
    holm_family(cells)


def resolved(d: dict) -> bool:
    """Whether a paired difference survives Holm's correction over its table."""
    return d.get("p_holm") is not None and d["p_holm"] < ALPHA


def fmt_interval(d: dict) -> str:
    """A paired difference's Student-t 95% interval in signed points, ``[-3.1, +2.0]``; ``n/a
    (1 seed)`` without one."""
    if not d.get("t95"):
        return "n/a (1 seed)"
    return f"[{100 * d['t95'][0]:+.1f}, {100 * d['t95'][1]:+.1f}]"


def pair_label(name: str) -> str:
    """A paired difference's name as tables print it: ``x-y`` -> ``(x) - (y)``."""
    return f"({name.replace('-', ') - (')})"


def diff_row(cells: Sequence[str], d: dict, mean: str | None = None,
             ci: str | None = None) -> str:
    """One table row of a paired difference: ``cells`` (what it is), its mean and interval
    (signed points unless given), p, Holm p and seed count; mean and interval in bold only
    where it survives Holm's correction over its table (:func:`resolved`)."""
    if mean is None:
        mean, ci = f"{100 * d['mean']:+.1f}", fmt_interval(d)
    if resolved(d):
        mean, ci = f"**{mean}**", f"**{ci}**"
    return ("| " + " | ".join([*cells, mean, ci, fmt_p(d.get("p")), fmt_p(d.get("p_holm")),
                               str(len(d["per_seed"]))]) + " |")


def fmt_p(p: float | None) -> str:
    """A p-value as tables print it (``-`` without a test)."""
    if p is None:
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}"
