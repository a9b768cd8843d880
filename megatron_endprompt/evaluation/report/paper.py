"""The EndPrompt paper's three result tables from a results dict: RULER per task x length with
the 4K-64K average, LongBench per category with the average, short-text retention per benchmark
with the average; the paper's published averages beside ours, marked as the paper's.

RULER's average (RULER ``scripts/eval/synthetic`` summary, as the paper reports it): per length,
the mean of the task scores; then the mean over the lengths 4K, 8K, 16K, 32K, 64K.

A paper number is printed as comparable only when the run follows the paper's protocol for that
table (``paper_protocol``: tasks, lengths, haystack, sample count, items, context, shots, chat
setting); otherwise the table prints ``not comparable: <every reason>``.

Published numbers (:data:`PAPER`, arXiv 2605.14589v1, "EndPrompt: Efficient Long-Context
Extension via Terminal Anchoring": LLaMA-family models extended from 8K to 64K): averages only, no
per-task cells, each with where in the paper it is and which statistic it is. The RULER averages
of EndPrompt (76.03), full-length fine-tuning (69.23), LCEG (72.24) and LongLoRA (72.95) are in
the abstract; PoSE's RULER average (78.91) is from section 4.4 / Figure 3 (not Table 1).
EndPrompt's LongBench average (38.30) is the paper's reported average; it is not the mean of its
six category means (those average to 37.99), so it is set beside our mean over the tasks run as
well as our mean over categories. The short-text average 53.56 is sft_ET(PoSE), the SFT'd
EndPrompt-on-PoSE model; sft_ET's is 52.41. We do not assert which model row of the paper a run
corresponds to: the reader must check that the model and training setting match.
"""

from __future__ import annotations

from typing import Any

from dataclasses import dataclass

from megatron_endprompt.evaluation.longbench.spec import CATEGORIES
from megatron_endprompt.evaluation.report.protocol import (longbench_reasons, ruler_reasons,
                                                          short_text_reasons)
from megatron_endprompt.evaluation.ruler.qa import QA_TASKS
from megatron_endprompt.evaluation.ruler.spec import SYNTHETIC_TASKS
from megatron_endprompt.evaluation.short_text.spec import BENCHMARKS

__all__ = ["PAPER", "PAPER_ID", "PaperNumber", "RULER_13", "PAPER_LENGTHS",
           "ruler_paper_average", "comparability",
           "paper_tables"]

RULER_13: tuple[str, ...] = (*SYNTHETIC_TASKS, *QA_TASKS)
PAPER_LENGTHS: tuple[int, ...] = (4096, 8192, 16384, 32768, 65536)
PAPER_ID = "arXiv 2605.14589v1"


@dataclass(kw_only=True, frozen=True)
class PaperNumber:
    """One average published in the paper."""

    model: str
    """The paper's name for the model / method."""
    value: float
    """The published number (0-100)."""
    where: str
    """Where in the paper it is printed."""
    statistic: str
    """What it averages (so a reader compares it with the same statistic of a run)."""


#: table -> the paper's published averages.
PAPER: dict[str, tuple[PaperNumber, ...]] = {
    "ruler_4k_64k": tuple(
        PaperNumber(model=m, value=v, where=w,
                    statistic="mean over 4K-64K of the per-length mean of RULER's 13 tasks")
        for m, v, w in (("EndPrompt", 76.03, "abstract"),
                        ("full-length fine-tuning", 69.23, "abstract"),
                        ("LCEG", 72.24, "abstract"), ("LongLoRA", 72.95, "abstract"),
                        ("PoSE", 78.91, "section 4.4 / Figure 3"))),
    "longbench": (PaperNumber(
        model="EndPrompt", value=38.30, where="Table 2",
        statistic="the paper's reported average; not the mean of its six category means "
                  "(37.99)"),),
    "short_text": (
        PaperNumber(model="sft_ET(PoSE)", value=53.56, where="Table 5",
                    statistic="mean of the benchmark scores, after SFT"),
        PaperNumber(model="sft_ET", value=52.41, where="Table 5",
                    statistic="mean of the benchmark scores, after SFT")),
}


def ruler_paper_average(tasks: dict[str, Any]) -> dict[str, Any]:
    """RULER's average over the 13 tasks: per length (tasks run), then over 4K-64K.

    ``tasks``: ``{task: {"scores": {"4096": 0-100, ...}}}``. Returns ``{"per_length",
    "average_4k_64k", "missing_tasks", "missing_lengths"}``; the 4K-64K average uses the paper
    lengths that have a score (whether it is comparable: ``paper_protocol.ruler_reasons``)."""
    run = [t for t in RULER_13 if t in tasks]
    per_length: dict[str, float | None] = {}
    for n in PAPER_LENGTHS:
        vals = [tasks[t]["scores"].get(str(n)) for t in run]
        vals = [v for v in vals if v is not None]
        per_length[str(n)] = round(sum(vals) / len(vals), 2) if vals else None
    have = [v for v in per_length.values() if v is not None]
    missing_lengths = [n for n in PAPER_LENGTHS if per_length[str(n)] is None]
    missing_tasks = [t for t in RULER_13 if t not in tasks]
    return {"per_length": per_length,
            "average_4k_64k": round(sum(have) / len(have), 2) if have else None,
            "lengths_averaged": [n for n in PAPER_LENGTHS if per_length[str(n)] is not None],
            "tasks_averaged": run,
            "missing_tasks": missing_tasks, "missing_lengths": missing_lengths}


def _f(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _paper_lines(table: str, reasons: list[str], ours: str) -> list[str]:
    """The paper's numbers of ``table`` beside ``ours`` when ``reasons`` is empty, else
    ``not comparable: <every reason>``."""
    if reasons:
        return [f"Paper's {ours}: not comparable: " + "; ".join(reasons) + "."]
    return [f"Paper's {ours} ({PAPER_ID}), comparable with this run:"] + [
        f"- {n.model} {n.value:.2f} ({n.where}; {n.statistic})" for n in PAPER[table]]


def _ruler_table(results: dict[str, Any]) -> list[str]:
    tasks = {t: s for t, s in results.get("tasks", {}).items() if t in RULER_13}
    if not tasks:
        return []
    lengths = [int(n) for n in results["meta"]["lengths"]]
    avg = ruler_paper_average(tasks)
    rows = ["### RULER (score %, per task x length)", "",
            "| task | " + " | ".join(str(n) for n in lengths) + " |",
            "|" + "---|" * (len(lengths) + 1)]
    for t in RULER_13:
        if t in tasks:
            rows.append(f"| {t} | " + " | ".join(_f(tasks[t]["scores"].get(str(n)))
                                                for n in lengths) + " |")
    means = []
    for n in lengths:
        vals = [s["scores"].get(str(n)) for s in tasks.values()]
        vals = [v for v in vals if v is not None]
        means.append(round(sum(vals) / len(vals), 2) if vals else None)
    rows.append(f"| mean over {len(tasks)} tasks | " + " | ".join(map(_f, means)) + " |")
    counts = {(t, n): k for t, e in tasks.items() for n, k in (e.get("items") or {}).items()}
    if counts:
        same = set(counts.values())
        rows += ["", f"Items: {same.pop()} per task x length." if len(same) == 1 else
                 "Items per task x length: " + ", ".join(f"{t}@{n} {k}"
                                                          for (t, n), k in counts.items()) + "."]
    covered = [n for n in PAPER_LENGTHS if avg["per_length"][str(n)] is not None]
    label = ("4K-64K" if len(covered) == len(PAPER_LENGTHS) else
             "/".join(f"{n // 1024}K" for n in covered) or "no paper length")
    rows += ["", f"{label} average over {len(tasks)} task(s) (ours): "
             f"{_f(avg['average_4k_64k'])}"]
    return rows + _paper_lines("ruler_4k_64k", ruler_reasons(results, avg), "4K-64K averages")


def _longbench_table(results: dict[str, Any]) -> list[str]:
    lb = results["longbench"]
    items = lb.get("items", {})
    rows = [f"### LongBench (English, context {lb['length']}, prompts cut to "
            f"{lb['max_prompt_tokens']} tokens)", "",
            "| category | tasks (score, items) | score |", "|---|---|---|"]
    for cat, members in CATEGORIES.items():
        cells = ", ".join(f"{t} {_f(lb['tasks'][t])} ({items.get(t, '?')})" for t in members
                          if t in lb["tasks"])
        rows.append(f"| {cat} | {cells or 'not run'} | {_f(lb['categories'][cat])} |")
    rows.append(f"| average over categories | | {_f(lb['average'])} |")
    scores = list(lb["tasks"].values())
    rows.append(f"| average over tasks | | {_f(sum(scores) / len(scores) if scores else None)} |")
    rows.append("")
    rows += _paper_lines("longbench", longbench_reasons(results), "LongBench average")
    if not longbench_reasons(results):
        rows.append("The paper's 38.30 is its reported average, not the mean of its category "
                    "means (37.99): read it beside our average over tasks.")
    rows.append("Chinese tasks not run (jieba segmentation not carried): "
                + ", ".join(lb["skipped_chinese"]) + ".")
    return rows


def _short_table(results: dict[str, Any]) -> list[str]:
    st = results["short_text"]
    rows = ["### Short-text retention", "", "| benchmark | metric | shots | items | score |",
            "|---|---|---|---|---|"]
    for b in BENCHMARKS:
        e = st["benchmarks"].get(b)
        rows.append(f"| {b} | {e['metric']} | {e['num_fewshot']} | {e.get('items', '?')} | "
                    f"{_f(e['score'])} |" if e else f"| {b} | | | | not run |")
    rows += [f"| average | | | | {_f(st['average'])} |", ""]
    return rows + _paper_lines("short_text", short_text_reasons(results),
                               "short-text averages (after an SFT phase)")


def comparability(results: dict[str, Any]) -> dict[str, Any]:
    """Per paper table the run has: ``{"comparable": bool, "reasons": [...]}`` (what the JSON
    records beside the markdown's verdict)."""
    out: dict[str, Any] = {}
    ruler = {t: s for t, s in results.get("tasks", {}).items() if t in RULER_13}
    if ruler:
        out["ruler_4k_64k"] = ruler_reasons(results, ruler_paper_average(ruler))
    if results.get("longbench"):
        out["longbench"] = longbench_reasons(results)
    if results.get("short_text"):
        out["short_text"] = short_text_reasons(results)
    return {k: {"comparable": not r, "reasons": r} for k, r in out.items()}


def paper_tables(results: dict[str, Any]) -> str:
    """Markdown of the three tables (each only when its evaluation ran); ``""`` when none."""
    parts = [_ruler_table(results)]
    if results.get("longbench"):
        parts.append(_longbench_table(results))
    if results.get("short_text"):
        parts.append(_short_table(results))
    blocks = ["\n".join(p) for p in parts if p]
    if not blocks:
        return ""
    return ("\n## Paper layout\n\nNumbers marked \"Paper's\" are published in the EndPrompt "
            f"paper ({PAPER_ID}), not measured here; they are shown only where this run follows "
            "the paper's protocol, and compare only when the model and training setting match."
            "\n\n" + "\n\n".join(blocks) + "\n")
