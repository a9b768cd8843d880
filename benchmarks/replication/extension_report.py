"""Statistics and tables of the extension protocol, from its results JSON only (so a committed
JSON re-renders them: ``python -m benchmarks.replication.extension --rerender RESULTS.json``).

Per row and task: score(L0), score(L) and ``retention`` = score(L) - score(L0), each as the
mean over seeds with its Student-t 95% interval. Between rows: the paired-by-seed difference of
retentions (one Holm family) and of score(L0) (another), with the paired t-test's p and its
Holm-adjusted p; bold only what survives Holm. PI only has no seed: its one evaluation is
paired with every seed of the other row.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from benchmarks.replication import stats
from megatron_endprompt.disk import write_text

TASKS = ("niah_single_1", "passkey")
SHORT = {"niah_single_1": "NIAH", "passkey": "passkey"}


def _lengths(results: dict) -> tuple[str, str]:
    c = results["config"]
    return str(c["L0"]), str(c["L"])


def per_seed(results: dict, row: str, task: str) -> dict[str, dict[str, float]]:
    """``{seed: {"L0": acc, "L": acc, "retention": acc(L) - acc(L0)}}`` of one row."""
    L0, L = _lengths(results)
    out = {}
    for seed, e in results["rows"][row]["seeds"].items():
        counts = e["counts"].get(task, {})
        if L0 in counts and L in counts and counts[L0][1] and counts[L][1]:
            a0, a1 = counts[L0][0] / counts[L0][1], counts[L][0] / counts[L][1]
            out[seed] = {"L0": a0, "L": a1, "retention": a1 - a0}
    return out


def _paired(x: dict, y: dict, key: str) -> dict | None:
    """Paired differences ``x - y`` of ``key``; a row with one unseeded run (``-``) pairs with
    every seed of the other."""
    if "-" in y and len(y) == 1:
        diffs = [v[key] - y["-"][key] for v in x.values()]
    elif "-" in x and len(x) == 1:
        diffs = [x["-"][key] - v[key] for v in y.values()]
    else:
        diffs = [x[s][key] - y[s][key] for s in sorted(set(x) & set(y), key=int)]
    return stats.paired_summary(diffs) if diffs else None


def summarize(results: dict, pairs: Sequence[tuple[str, str]]) -> None:
    """``results["summary"]`` (per row and task: ``L0``, ``L``, ``retention`` cells) and
    ``results["paired"]`` (``retention`` and ``L0`` families), in place."""
    summary: dict = {}
    for row in results["rows"]:
        summary[row] = {}
        for t in TASKS:
            ps = per_seed(results, row, t)
            summary[row][t] = {k: _cell([v[k] for v in ps.values()], signed=k == "retention")
                               for k in ("L0", "L", "retention")} if ps else {}
    results["summary"] = summary
    paired: dict = {"retention": {}, "L0": {}}
    for key, fam in paired.items():
        for x, y in pairs:
            if x not in results["rows"] or y not in results["rows"]:
                continue
            for t in TASKS:
                d = _paired(per_seed(results, x, t), per_seed(results, y, t), key)
                if d:
                    fam.setdefault(f"{x}-{y}", {})[t] = d
        stats.holm_family([d for by_t in fam.values() for d in by_t.values()])
    results["paired"] = paired


def _cell(values: list[float], *, signed: bool) -> dict:
    """Mean and Student-t 95% interval (accuracies clipped to [0, 1]; retentions not)."""
    if len(values) < 2:
        return {"mean": values[0], "t95": None, "per_seed": values}
    d = stats.paired_summary(values)
    lo, hi = d["t95"]
    if not signed:
        lo, hi = max(0.0, lo), min(1.0, hi)
    return {"mean": d["mean"], "t95": [lo, hi], "per_seed": values}


def fmt(c: dict | None, *, signed: bool = False) -> str:
    if not c:
        return "n/a"
    m = f"{100 * c['mean']:+.1f}" if signed else f"{100 * c['mean']:.1f}"
    if not c.get("t95"):
        return m
    lo, hi = c["t95"]
    return (f"{m} [{100 * lo:+.1f}, {100 * hi:+.1f}]" if signed
            else f"{m} [{100 * lo:.1f}, {100 * hi:.1f}]")


def main_table(results: dict) -> str:
    L0, L = _lengths(results)
    head = ["row", "tokens/step"]
    for t in TASKS:
        head += [f"{SHORT[t]} @{L0}", f"{SHORT[t]} @{L}", f"{SHORT[t]} retention"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = results["base"]["eval"]["counts"]
    cells = ["base, s=1 (no PI)", "-"]
    for t in TASKS:
        a0, a1 = (base[t][n][0] / base[t][n][1] for n in (L0, L))
        cells += [f"{100 * a0:.1f}", f"{100 * a1:.1f}", f"{100 * (a1 - a0):+.1f}"]
    rows.append("| " + " | ".join(cells) + " |")
    for k, e in results["rows"].items():
        runs = list(e["seeds"].values())
        tps = runs[0].get("tokens_per_step") if runs else None
        cells = [f"({k}) {e['label']}", f"{tps:,}" if tps else "-"]
        for t in TASKS:
            s = results["summary"][k].get(t, {})
            cells += [fmt(s.get("L0")), fmt(s.get("L")), fmt(s.get("retention"), signed=True)]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def paired_table(results: dict, family: str) -> str:
    rows = ["| difference | task | mean (points) | 95% t interval | p | Holm p | seeds |",
            "|---|---|---|---|---|---|---|"]
    for name, by_t in results["paired"][family].items():
        for t, d in by_t.items():
            rows.append(stats.diff_row([stats.pair_label(name), SHORT[t]], d))
    return "\n".join(rows)


def notes(results: dict) -> str:
    c = results["config"]
    fill = results.get("fill") or {}
    fills = "; ".join(f"{SHORT[t]} @{n}: {lo}-{hi}" for t in TASKS
                      for n, (lo, hi) in fill.get(t, {}).items())
    done = results.get("seeds_done", c["seeds"])
    return (f"L0 = {c['L0']}, L = {c['L']} (PI s = {c['L'] // c['L0']}), P = {c['P']}; model "
            f"hidden {c['hidden']}, {c['layers']} layers, vocabulary {c['vocab']}; base "
            f"{c['base_iters']} steps x {c['base_mb']} sequences at L0, then "
            f"{' + '.join(map(str, c.get('base_more', [])))} template-heavy steps; "
            f"base at L0: {base_l0(results)}; fine-tuning "
            f"{c['ft_iters']} steps, {c['ft_docs']} x P tokens per step, LR {c['ft_lr']:g}; "
            f"terminal: EP1 (w = {c['prompt_w']:g}), continuation b = {c['terminal']} "
            f"(w = {c['prompt_w']:g}); {done} of {c['seeds']} seed(s). Accuracy in % over "
            f"{c['samples']} prompts per task and length (the same prompts for every row and "
            f"seed); mean [Student-t 95% interval over seeds]. Prompt tokens (+ 12 / 10 "
            f"generated) per cell: {fills}.")


def base_l0(results: dict) -> str:
    """The base's scores at ``L0`` (``s = 1``), as the notes print them."""
    L0 = str(results["config"]["L0"])
    counts = results["base"]["eval"]["counts"]
    return ", ".join(f"{SHORT[t]} {counts[t][L0][0]:.0f}/{counts[t][L0][1]}" for t in TASKS)


def write_md(results: dict, out_json: str) -> str:
    """The tables beside ``out_json``; returns the path."""
    path = os.path.splitext(out_json)[0] + ".md"
    text = (main_table(results) + "\n\n" + notes(results) + "\n\n"
            "Paired differences of retention (score(L) - score(L0)), by seed; paired t-test, "
            "Holm over this table; bold: Holm p < 0.05:\n\n" + paired_table(results, "retention")
            + "\n\nPaired differences of score(L0) (inside the window), by seed; Holm over this "
            "table:\n\n" + paired_table(results, "L0") + "\n")
    write_text(path, text)
    return path
