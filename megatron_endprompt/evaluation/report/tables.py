"""Reports of an evaluation: the results JSON, a markdown table, the NIAH heatmap (depth x
length accuracy per retrieval task) and the perplexity-vs-length plot.

For ``--output FILE.json`` the files are ``FILE.json``, ``FILE.md``, ``FILE_niah.png`` (when a
retrieval task ran) and ``FILE_ppl.png`` (when perplexity ran).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

from megatron_endprompt.disk import write_text
from megatron_endprompt.evaluation.report.paper import (
    RULER_13,
    comparability,
    paper_tables,
    ruler_paper_average,
)
from megatron_endprompt.evaluation.ruler.spec import ESSAY_TASKS
from megatron_endprompt.evaluation.core.results_io import finite_or_null, output_paths, sanitized
from megatron_endprompt.evaluation.core.scoring import mean_score

__all__ = ["depth_key", "finite", "summarize", "items_note", "markdown_table", "plot_heatmap",
           "plot_ppl",
           "ppl_note", "metrics_markdown", "output_paths", "write_tables", "write_reports"]


def depth_key(depth: float) -> str:
    """JSON key of a depth (``0.25`` -> ``"0.25"``)."""
    return f"{depth:g}"


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, inf) replaced by ``None`` (JSON ``null``),
    recursively; one ``warning:`` line names where (:func:`.results_io.sanitized`)."""
    return sanitized(value) if isinstance(value, dict) else finite_or_null(value)


def _pct(vals: list[float]) -> float | None:
    """RULER's task score: mean per-prediction score x 100, rounded to 2 decimals."""
    m = mean_score(vals)
    return None if m is None else round(100 * m, 2)


def _nearest(depth: float, grid: Sequence[float]) -> float:
    return min(grid, key=lambda g: (abs(g - depth), g))


def summarize(records: Sequence[dict[str, Any]], haystack: Any,
              depths: Sequence[float]) -> dict[str, Any]:
    """``{"tasks": ..., "ruler": ...}`` of the records so far.

    Per task: score per length (0-100), score per (length, depth) where the task has needles
    (RULER's needle depths binned to the nearest of ``depths``), whether it is exact RULER,
    its haystack, and the per-sample outputs. ``ruler``: the average over the RULER tasks run,
    per length and overall, and which tasks are exact or used the substitute haystack."""
    tasks: dict[str, Any] = {}
    for task in dict.fromkeys(r["task"] for r in records):
        recs = [r for r in records if r["task"] == task]
        lengths = list(dict.fromkeys(r["length"] for r in recs))
        is_ruler = task in RULER_13
        essay = task in ESSAY_TASKS
        entry: dict[str, Any] = {
            "ruler": is_ruler,
            "exact_ruler": is_ruler and not (essay and haystack is not None
                                             and haystack.substitute),
            "haystack": (("substitute haystack: " if haystack.substitute else "")
                         + haystack.source) if essay and haystack is not None else None,
            "scores": {str(n): _pct([r["score"] for r in recs if r["length"] == n])
                       for n in lengths},
            "items": {str(n): sum(1 for r in recs if r["length"] == n) for n in lengths},
        }
        if any(r["depth"] is not None for r in recs) and depths:
            entry["by_depth"] = {str(n): {depth_key(d): _pct(
                [r["score"] for r in recs if r["length"] == n and r["depth"] is not None
                 and _nearest(r["depth"], depths) == d]) for d in depths} for n in lengths}
        # compact per-sample scores; prompts and outputs go to --save-prompts
        entry["samples"] = [{k: r.get(k) for k in ("length", "index", "depth", "score",
                                                   "prompt_tokens")} for r in recs]
        tasks[task] = entry
    ruler_tasks = [t for t in tasks if tasks[t]["ruler"]]
    out: dict[str, Any] = {"tasks": tasks}
    if ruler_tasks:
        lengths = list(dict.fromkeys(r["length"] for r in records if r["task"] in ruler_tasks))
        avg = {}
        for n in lengths:
            vals = [tasks[t]["scores"].get(str(n)) for t in ruler_tasks]
            vals = [v for v in vals if v is not None]
            avg[str(n)] = round(sum(vals) / len(vals), 2) if vals else None
        have = [v for v in avg.values() if v is not None]
        out["ruler"] = {
            "tasks_run": ruler_tasks,
            "exact_ruler_tasks": [t for t in ruler_tasks if tasks[t]["exact_ruler"]],
            "substitute_haystack_tasks": [t for t in ruler_tasks if not tasks[t]["exact_ruler"]],
            "average": avg,
            "average_over_lengths": round(sum(have) / len(have), 2) if have else None,
            "note": "average of RULER task scores (string_match_all / string_match_part x 100) "
                    "over the tasks run; comparable to published RULER tables only over the "
                    "same tasks",
            "paper_average": ruler_paper_average({t: tasks[t] for t in ruler_tasks}),
        }
    return out


def _fmt_score(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _fmt_ppl(entry: dict[str, Any] | None) -> str:
    if entry is None or entry.get("ppl") is None:
        return "n/a"
    v = entry["ppl"]
    return f"{v:.2f}" if v < 1e4 else f"{v:.3g}"


def ppl_note(ppl: dict[str, Any]) -> str:
    """What perplexity scored per length: documents (and those skipped as shorter than the
    length), scored tokens and windows. ``--samples`` never applies to it, so the report
    names these counts instead of a sample count."""
    parts = []
    for n, e in ppl["by_length"].items():
        if e is None:
            continue
        docs = (f"{e['docs']} document(s) ({e.get('docs_skipped', 0)} shorter skipped), "
                if "docs" in e else "one EOS-joined stream, ")
        parts.append(f"{n}: {docs}{e.get('tokens', 0)} scored token(s) in "
                     f"{e.get('windows', 0)} window(s)")
    return (f"Perplexity (stride {ppl['stride']}) scored " + "; ".join(parts) + "."
            if parts else "Perplexity scored nothing.")


def items_note(tasks: dict[str, Any]) -> str:
    """How many items each task x length scored: ``"500 item(s) per task x length"`` when every
    cell has the same count, else every cell's (``""`` when no task records items)."""
    cells = {(t, n): k for t, e in tasks.items() for n, k in (e.get("items") or {}).items()}
    if not cells:
        return ""
    if len(set(cells.values())) == 1:
        return f"{next(iter(cells.values()))} item(s) per task x length"
    return "items per task x length: " + ", ".join(f"{t}@{n} {k}" for (t, n), k in cells.items())


def _fmt_metric(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


#: lm-eval metrics that are fractions of items (0-1): shown x 100, on every table's scale.
FRACTION_METRICS = frozenset({"acc", "acc_norm", "exact_match", "f1", "em", "mc1", "mc2",
                              "contains", "pass@1", "pass_at_1", "string_match"})


def metrics_markdown(results: dict[str, Any]) -> str:
    """One row per task (and group) x metric: value and stderr, fractions (:data:`FRACTION_METRICS`
    and RULER's per-length scores) x 100 as every other table, the rest as lm-eval reports
    them; empty when no task has ``metrics`` (the native backend)."""
    rows = []
    for kind in ("tasks", "groups"):
        for name, entry in results.get(kind, {}).items():
            for metric, m in entry.get("metrics", {}).items():
                if metric.isdigit() and entry.get("scores"):
                    continue  # in the per-length table
                label = f"{name} (group)" if kind == "groups" else name
                scale = 100.0 if (metric.split(",")[0] in FRACTION_METRICS
                                  or metric.isdigit()) else 1.0
                value, err = (None if v is None else scale * v for v in (m["value"],
                                                                         m["stderr"]))
                shown = f"{metric} (0-100)" if scale == 100.0 else metric
                rows.append(f"| {label} | {shown} | {_fmt_metric(value)} | "
                            f"{_fmt_metric(err)} |")
    if not rows:
        return ""
    return "\n".join(["| task | metric | value | stderr |", "|---|---|---|---|", *rows]) + "\n"


def markdown_table(results: dict[str, Any]) -> str:
    """One row per task (score in %, or perplexity), one column per length."""
    lengths = [int(n) for n in results["meta"]["lengths"]]
    head = "| task | " + " | ".join(str(n) for n in lengths) + " |"
    rows = [head, "|" + "---|" * (len(lengths) + 1)]
    for task, summ in results.get("tasks", {}).items():
        if "metrics" in summ and not summ["scores"]:
            continue  # an lm-eval task without per-length metrics: in the metrics table
        mark = "" if not summ["ruler"] else (" (RULER)" if summ["exact_ruler"]
                                             else " (RULER, substitute haystack)")
        cells = [_fmt_score(summ["scores"].get(str(n))) for n in lengths]
        rows.append(f"| {task}{mark} | " + " | ".join(cells) + " |")
    ruler = results.get("ruler")
    if ruler:
        cells = [_fmt_score(ruler["average"].get(str(n))) for n in lengths]
        rows.append(f"| RULER average ({len(ruler['tasks_run'])} tasks) | "
                    + " | ".join(cells) + " |")
    if "ppl" in results:
        by_len = results["ppl"]["by_length"]
        rows.append("| ppl | " + " | ".join(_fmt_ppl(by_len.get(str(n))) for n in lengths)
                    + " |")
    meta = results["meta"]
    items = items_note(results.get("tasks", {}))
    prompts = (f"{items}, " if items else f"{meta['samples'] or 'all'} sample(s) per task x "
               "length, ") if results.get("tasks") else ""
    note = (f"\nModel `{meta['hf_dir']}` (max_position_embeddings "
            f"{meta.get('max_position_embeddings')}), {prompts}seed {meta['seed']}, "
            f"{meta['dtype']} on {meta['device']}.")
    if "ppl" in results:
        note += " " + ppl_note(results["ppl"])
    if meta.get("chat_template_base_tasks"):
        note += (" Under --chat-template model, "
                 + ", ".join(meta["chat_template_base_tasks"])
                 + " prompts stay base (no chat template).")
    if meta.get("haystack"):
        h = meta["haystack"]
        note += (f" Essay haystack: {h['source']}"
                 + (f" ({h['chars']:,} characters, sha256 {h['sha256'][:16]}...)"
                    if h.get("sha256") else "")
                 + (" (substitute for RULER's Paul Graham essays)." if h["substitute"] else "."))
    metrics = metrics_markdown(results)
    return ("\n".join(rows) + "\n" + (f"\n{metrics}" if metrics else "") + note + "\n"
            + paper_tables(results))


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_heatmap(results: dict[str, Any], path: str) -> None:
    """The NIAH picture: one panel per task with needles, depth (rows, 0 = top of the context)
    by length (columns), colour = score."""
    plt = _pyplot()
    retrieval = {t: s for t, s in results["tasks"].items() if "by_depth" in s}
    tasks = list(retrieval)
    lengths = [int(n) for n in results["meta"]["lengths"]]
    depths = [float(d) for d in results["meta"]["depths"]]
    cols = min(len(tasks), 3)
    rows = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False, layout="constrained",
                             figsize=(1.5 + (1.6 + 0.6 * len(lengths)) * cols,
                                      0.6 + (1.4 + 0.3 * len(depths)) * rows))
    image = None
    for k, task in enumerate(tasks):
        ax = axes[k // cols][k % cols]
        grid = [[retrieval[task]["by_depth"].get(str(n), {}).get(depth_key(d)) for n in lengths]
                for d in depths]
        data = [[math.nan if v is None else v for v in row] for row in grid]
        image = ax.imshow(data, cmap="RdYlGn", vmin=0.0, vmax=100.0, aspect="auto")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if v is not None:
                    ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], rotation=45, fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{100 * d:.0f}%" for d in depths], fontsize=7)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("context length (tokens)", fontsize=8)
        ax.set_ylabel("needle depth", fontsize=8)
    for k in range(len(tasks), rows * cols):
        axes[k // cols][k % cols].axis("off")
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), label="score (%)", shrink=0.8)
    fig.suptitle(os.path.basename(os.path.normpath(results["meta"]["hf_dir"])), fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ppl(results: dict[str, Any], path: str) -> None:
    """Perplexity vs length (log-2 x axis); a dashed line marks ``max_position_embeddings``."""
    plt = _pyplot()
    by_len = results["ppl"]["by_length"]
    pts = [(int(n), e["ppl"]) for n, e in by_len.items()
           if e is not None and e["ppl"] is not None]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
        ax.set_xscale("log", base=2)
        ax.set_xticks([p[0] for p in pts], [str(p[0]) for p in pts])
    mpe = results["meta"].get("max_position_embeddings")
    if mpe and pts and min(p[0] for p in pts) <= mpe * 2:
        ax.axvline(mpe, ls="--", color="grey", label=f"max_position_embeddings={mpe}")
        ax.legend(fontsize=8)
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title(f"per-document sliding-window PPL (stride {results['ppl']['stride']})",
                 fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_tables(results: dict[str, Any], json_path: str) -> list[str]:
    """Write the JSON (non-finite numbers as null) and markdown of ``results`` atomically."""
    paths = output_paths(json_path)
    os.makedirs(os.path.dirname(os.path.abspath(paths["json"])), exist_ok=True)
    clean = finite({k: v for k, v in results.items() if k != "written"})
    clean["paper_comparable"] = comparability(clean)
    write_text(paths["json"], json.dumps(clean, indent=2, allow_nan=False) + "\n")
    write_text(paths["md"], markdown_table(clean))
    return [paths["json"], paths["md"]]


def write_reports(results: dict[str, Any], json_path: str) -> list[str]:
    """Write every report of ``results`` (tables, heatmap, PPL plot); returns the paths."""
    paths = output_paths(json_path)
    written = write_tables(results, json_path)
    clean = finite(results)
    if any("by_depth" in s for s in clean.get("tasks", {}).values()):
        plot_heatmap(clean, paths["niah_png"])
        written.append(paths["niah_png"])
    if "ppl" in clean:
        plot_ppl(clean, paths["ppl_png"])
        written.append(paths["ppl_png"])
    return written
