"""The b/w/s sweep of the mini-replication: each variant of the best
placement is fine-tuned on the same seeds as the main table, so every variant's difference
from the default is paired by seed (the evaluation prompts are shared per seed) and carries a
Student-t interval once there are >= 2 seeds.

A variant changes one of: the terminal length ``b`` (``sweep_b``), the terminal loss weight
``w`` (0.1) or the PI factor ``s`` (twice the default). Seed 0 of a variant keeps the cache tag
of the earlier one-seed sweep (``sweep_<placement>_<label>``), so a ``--resume`` reuses it.
"""

from __future__ import annotations

from typing import Callable, Sequence

from benchmarks.replication import stats


def variants(c: dict) -> dict[str, dict]:
    """``{label: keyword arguments of Replication.method}`` of the sweep."""
    out = {f"b={v}": dict(terminal=v) for v in c.get("sweep_b", (32, 128))}
    out["w=0.1"] = dict(w=0.1)
    out[f"s={2 * c['ratio']}"] = dict(s=2 * c["ratio"])
    return out


def tag(place: str, label: str, seed: int) -> str:
    """The work-directory cache tag of one variant run."""
    base = f"sweep_{place}_{label.replace('=', '').replace('.', 'p')}"
    return base if seed == 0 else f"{base}_seed{seed}"


def run_sweep(method: Callable[..., dict], c: dict, default_seeds: dict[str, dict],
              place: str, seeds: int, tasks: Sequence[str]) -> dict:
    """Run every variant of ``place`` on seeds ``0..seeds-1``. ``method``:
    ``Replication.method``; ``default_seeds``: the main table's ``{seed: entry}`` of
    ``place``. Returns the ``results["sweep"]`` record: per variant its seeds, summary and
    ``paired`` (variant - default, ``{task: {length: paired_difference}}``)."""
    record = {"placement": place, "seeds": seeds,
              "default": {"terminal": c["terminal"], "w": c["w"], "s": c["ratio"]}, "runs": {}}
    lengths = c["lengths"].split(",")
    for label, kw in variants(c).items():
        runs = {str(s): method(place, s, tag=tag(place, label, s), **kw) for s in range(seeds)}
        record["runs"][label] = {
            "seeds": runs, "summary": stats.summarize(runs, tasks),
            "paired": {t: {n: stats.paired_difference(runs, default_seeds, t, n)
                           for n in lengths} for t in tasks}}
    # the sweep's differences are one Holm family (its own table)
    stats.holm_family([d for r in record["runs"].values() for by_n in r["paired"].values()
                       for d in by_n.values() if d])
    return record
