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

from megatron_endprompt.evaluation.results_io import sanitized
from megatron_endprompt.evaluation.scoring import mean_score

__all__ = ["depth_key", "summarize_retrieval", "markdown_table", "plot_heatmap", "plot_ppl",
           "output_paths", "write_reports"]


def depth_key(depth: float) -> str:
    """JSON key of a depth (``0.25`` -> ``"0.25"``)."""
    return f"{depth:g}"


def summarize_retrieval(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task: accuracy per length, accuracy per (length, depth), and the sample records."""
    out: dict[str, dict[str, Any]] = {}
    for task in dict.fromkeys(r["task"] for r in records):
        recs = [r for r in records if r["task"] == task]
        lengths = list(dict.fromkeys(r["length"] for r in recs))
        depths = list(dict.fromkeys(r["depth"] for r in recs))
        out[task] = {
            "accuracy": {str(n): mean_score(r["score"] for r in recs if r["length"] == n)
                         for n in lengths},
            "by_depth": {str(n): {depth_key(d): mean_score(
                r["score"] for r in recs if r["length"] == n and r["depth"] == d)
                for d in depths} for n in lengths},
            "samples": list(recs),
        }
    return out


def _fmt_acc(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def _fmt_ppl(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "n/a"
    v = entry["ppl"]
    return "inf" if v is None else (f"{v:.2f}" if v < 1e4 else f"{v:.3g}")


def markdown_table(results: dict[str, Any]) -> str:
    """One row per task (accuracy in %, or perplexity), one column per length."""
    lengths = [int(n) for n in results["meta"]["lengths"]]
    head = "| task | " + " | ".join(str(n) for n in lengths) + " |"
    rows = [head, "|" + "---|" * (len(lengths) + 1)]
    retrieval = results.get("retrieval", {})
    for task, summ in retrieval.items():
        cells = [_fmt_acc(summ["accuracy"].get(str(n))) for n in lengths]
        rows.append(f"| {task} (acc %) | " + " | ".join(cells) + " |")
    niah = [t for t in retrieval if t.startswith("niah_")]
    if len(niah) > 1:
        cells = []
        for n in lengths:
            vals = [retrieval[t]["accuracy"].get(str(n)) for t in niah]
            vals = [v for v in vals if v is not None]
            cells.append(_fmt_acc(sum(vals) / len(vals) if vals else None))
        rows.append("| niah mean (acc %) | " + " | ".join(cells) + " |")
    if "ppl" in results:
        by_len = results["ppl"]["by_length"]
        rows.append("| ppl | " + " | ".join(_fmt_ppl(by_len.get(str(n))) for n in lengths)
                    + " |")
    meta = results["meta"]
    note = (f"\nModel `{meta['hf_dir']}` (max_position_embeddings "
            f"{meta.get('max_position_embeddings')}), {meta['samples']} sample(s) per "
            f"length x depth, seed {meta['seed']}, {meta['dtype']} on {meta['device']}.\n")
    return "\n".join(rows) + "\n" + note


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_heatmap(results: dict[str, Any], path: str) -> None:
    """The NIAH picture: one panel per retrieval task, depth (rows, 0 = top of the context)
    by length (columns), colour = accuracy."""
    plt = _pyplot()
    retrieval = results["retrieval"]
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
        image = ax.imshow(data, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if v is not None:
                    ax.text(j, i, f"{100 * v:.0f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], rotation=45, fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{100 * d:.0f}%" for d in depths], fontsize=7)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("context length (tokens)", fontsize=8)
        ax.set_ylabel("needle depth", fontsize=8)
    for k in range(len(tasks), rows * cols):
        axes[k // cols][k % cols].axis("off")
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), label="accuracy", shrink=0.8)
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
    ax.set_title(f"sliding-window PPL (stride {results['ppl']['stride']})", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def output_paths(json_path: str) -> dict[str, str]:
    """``FILE.json`` -> the paths of the JSON, markdown and PNG outputs."""
    base = json_path[:-5] if json_path.endswith(".json") else json_path
    return {"json": json_path if json_path.endswith(".json") else base + ".json",
            "md": base + ".md", "niah_png": base + "_niah.png", "ppl_png": base + "_ppl.png"}


def _atomic_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def write_reports(results: dict[str, Any], json_path: str) -> list[str]:
    """Write every report of ``results``; returns the paths written."""
    paths = output_paths(json_path)
    os.makedirs(os.path.dirname(os.path.abspath(paths["json"])), exist_ok=True)
    written = []
    results = sanitized(results)  # NaN/inf -> null with a warning, never a lost evaluation
    _atomic_text(paths["json"], json.dumps(results, indent=2, allow_nan=False) + "\n")
    written.append(paths["json"])
    _atomic_text(paths["md"], markdown_table(results))
    written.append(paths["md"])
    if results.get("retrieval"):
        plot_heatmap(results, paths["niah_png"])
        written.append(paths["niah_png"])
    if "ppl" in results:
        plot_ppl(results, paths["ppl_png"])
        written.append(paths["ppl_png"])
    return written
