"""The length grid of the mini-replication: one results JSON per target
length ``L`` (``--length-grid``, or the main table's own JSON at its ``L``) merged into the
"extension length x method" table the paper does not have, and its figure. Only the JSONs
are read, so the committed results re-render it::

    python -m benchmarks.replication.grid OUT_STEM RESULT_L640.json RESULT_L1280.json ...

Table: per method and task, accuracy at ``L/2`` and ``L`` for each ``L`` (``mean [interval]``
as in the main table: Wilson for one seed), then the paired (d)-(b), (d)-(d0), (g1p)-(g1n)
differences at ``L`` per grid point. Figure: accuracy at ``L`` against ``L``, a panel per task.
"""

from __future__ import annotations

import json
import sys

from benchmarks.replication import stats
from benchmarks.replication.report import SHORT, TASKS, pyplot, save_figure
from megatron_endprompt.disk import write_text

METHODS = ("base", "b", "d", "d0", "f", "g1p", "g1n")
PAIRS = (("d", "b"), ("d", "d0"), ("g1p", "g1n"))


def load(paths: list[str]) -> list[dict]:
    """The results, sorted by ``L``; one JSON per ``L``."""
    runs = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            runs.append(json.load(f))
    runs.sort(key=lambda r: r["config"]["L"])
    Ls = [r["config"]["L"] for r in runs]
    if len(set(Ls)) != len(Ls):
        raise SystemExit(f"error: two results for the same L among {paths}")
    return runs


def _label(runs: list[dict], m: str) -> str:
    for r in runs:
        if m in r["methods"]:
            return f"({m}) {r['methods'][m]['name']}"
    return "base, s=1 (no PI)" if m == "base" else f"({m})"


def _cell(r: dict, m: str, task: str, n: int) -> dict | None:
    return r["summary"].get(m, {}).get(task, {}).get(str(n))


def table(runs: list[dict]) -> str:
    head = ["method"] + [f"{SHORT[t]} L={r['config']['L']}: {r['config']['L'] // 2} / "
                         f"{r['config']['L']}" for t in TASKS for r in runs]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in METHODS:
        if not any(m in r["summary"] for r in runs):
            continue
        cells = [_label(runs, m)]
        for t in TASKS:
            for r in runs:
                L = r["config"]["L"]
                half, full = _cell(r, m, t, L // 2), _cell(r, m, t, L)
                cells.append("not run" if half is None and full is None else
                             f"{stats.fmt_cell(half)} / {stats.fmt_cell(full)}")
        rows.append("| " + " | ".join(cells) + " |")
    rows += ["", "| difference at L | task | " + " | ".join(
        f"L={r['config']['L']} (s={r['config']['ratio']})" for r in runs) + " |",
             "|---|---|" + "---|" * len(runs)]
    def diff(r: dict, x: str, y: str, t: str) -> dict | None:
        return r.get("paired", {}).get(f"{x}-{y}", {}).get(t, {}).get(str(r["config"]["L"]))
    # the difference table is one Holm family (cells with one seed have no test)
    stats.refresh_family([d for x, y in PAIRS for t in TASKS for r in runs
                          if (d := diff(r, x, y, t))])
    for x, y in PAIRS:
        for t in TASKS:
            cells = []
            for r in runs:
                d = diff(r, x, y, t)
                text = "n/a" if not d else f"{100 * d['mean']:+.0f}" + (
                    f" {stats.fmt_interval(d)}" if d["t95"] else f" ({len(d['per_seed'])} seed)")
                cells.append(f"**{text}**" if d and stats.resolved(d) else text)
            rows.append(f"| ({x}) - ({y}) | {SHORT[t]} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def figure(runs: list[dict], path: str) -> str | None:
    plt = pyplot()
    if plt is None:
        return None
    Ls = [r["config"]["L"] for r in runs]
    fig, axes = plt.subplots(1, len(TASKS), figsize=(11, 4.5))
    for ax, t in zip(axes, TASKS):
        for m in METHODS:
            pts = [(r["config"]["L"], c) for r in runs
                   if (c := _cell(r, m, t, r["config"]["L"])) is not None]
            if not pts:
                continue
            xs = [p[0] for p in pts]
            (line,) = ax.plot(xs, [100 * c["mean"] for _, c in pts],
                              "--" if m == "base" else "-", marker="o", label=_label(runs, m))
            ax.fill_between(xs, [100 * c["shown"][0] for _, c in pts],
                            [100 * c["shown"][1] for _, c in pts], alpha=0.12,
                            color=line.get_color())
        ax.set(xscale="log", xlabel="target length L (evaluated at L)", ylabel="accuracy (%)",
               ylim=(-3, 103), title=SHORT[t])
        ax.set_xticks(Ls, [f"{L}\n(s={r['config']['ratio']})" for L, r in zip(Ls, runs)])
        ax.set_xticks([], minor=True)
    axes[-1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return save_figure(fig, path)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        raise SystemExit("error: usage: python -m benchmarks.replication.grid OUT_STEM "
                         "RESULT.json RESULT.json ... (one per L)")
    runs = load(argv[1:])
    write_text(argv[0] + ".md", table(runs) + "\n")
    png = figure(runs, argv[0] + ".png")
    print(f"wrote {argv[0]}.md" + (f", {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
