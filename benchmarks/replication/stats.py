"""Statistics of the mini-replication: Wilson intervals per cell, intervals across seeds, and
the per-method summary the tables and the figure read.

A *cell* is (method, task, length): ``k`` prompts retrieved of ``n``. Per seed: the Wilson 95%
score interval of ``k / n`` (prompts as Bernoulli trials). Across seeds two intervals, both
kept: the Student-t 95% interval of the per-seed accuracies (``mean +- t(0.975, S-1) * sd /
sqrt(S)``: the fine-tuning seed's variation; the prompts are the same in every seed) and the
Wilson interval of the pooled counts (``sum k / sum n``; treats the ``S x n`` answers as
independent, which they are not quite: the same prompts are asked of every seed). The tables
show the t interval where there are at least 2 seeds, else the single run's Wilson interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054
#: Student t quantiles t(0.975, df), df = 1..10 (standard tables; no scipy here).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228}


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
    mean = sum(values) / s
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (s - 1))
    half = T975.get(s - 1, 1.96) * sd / math.sqrt(s)
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
    on the same prompts per seed): ``{"mean", "per_seed", "t95"}`` with a Student-t 95%
    interval of the per-seed differences (in [-1, 1]; ``None`` for one shared seed). ``x``,
    ``y``: ``{seed: {"counts": {task: {length: [k, n]}}}}``; ``None`` without a shared seed."""
    diffs = []
    for seed in sorted(set(x) & set(y)):
        a = x[seed]["counts"].get(task, {}).get(length)
        b = y[seed]["counts"].get(task, {}).get(length)
        if a and b and a[1] and b[1]:
            diffs.append(a[0] / a[1] - b[0] / b[1])
    if not diffs:
        return None
    s, mean = len(diffs), sum(diffs) / len(diffs)
    t = None
    if s >= 2:
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (s - 1))
        half = T975.get(s - 1, 1.96) * sd / math.sqrt(s)
        t = [max(-1.0, mean - half), min(1.0, mean + half)]
    return {"mean": mean, "per_seed": diffs, "t95": t}


def fmt_interval(d: dict) -> str:
    """A paired difference's Student-t 95% interval in signed points, ``[-3, +2]``; ``n/a (1
    seed)`` without one."""
    if not d.get("t95"):
        return "n/a (1 seed)"
    return f"[{100 * d['t95'][0]:+.0f}, {100 * d['t95'][1]:+.0f}]"
