"""The EndPrompt paper's three result tables from a results dict: RULER per task x length with
the 4K-64K average, LongBench per category with the average, short-text retention per benchmark
with the average; the paper's published averages beside ours, marked as the paper's.

RULER's average (RULER ``scripts/eval/synthetic`` summary, as the paper reports it): per length,
the mean of the task scores; then the mean over the lengths 4K, 8K, 16K, 32K, 64K. It is
comparable to the paper's only over the same 13 tasks and all five lengths, so the paper's
numbers are shown only when the run has them (``comparable``); otherwise the table says what is
missing.

Published numbers (:data:`PAPER`): averages only, no per-task cells. The RULER averages of
EndPrompt (76.03), full-length fine-tuning (69.23), LCEG (72.24) and LongLoRA (72.95) are in the
paper's abstract (arXiv 2605.14589v1: LLaMA-family models extended from 8K to 64K); PoSE's
RULER average (78.91), EndPrompt's LongBench average (38.30) and short-text average (53.56)
are as the project's task statement transcribed them from the paper's Tables 1, 2, 5 (not
re-checked against the tables here). We do not assert which model row of the paper a run corresponds to:
the reader must check that the model and training setting match.
"""

from __future__ import annotations

from typing import Any

from megatron_endprompt.evaluation.longbench_spec import CATEGORIES
from megatron_endprompt.evaluation.ruler_qa import QA_TASKS
from megatron_endprompt.evaluation.ruler_spec import SYNTHETIC_TASKS
from megatron_endprompt.evaluation.short_text import BENCHMARKS

__all__ = ["PAPER", "PAPER_SOURCE", "RULER_13", "PAPER_LENGTHS", "ruler_paper_average",
           "paper_tables"]

RULER_13: tuple[str, ...] = (*SYNTHETIC_TASKS, *QA_TASKS)
PAPER_LENGTHS: tuple[int, ...] = (4096, 8192, 16384, 32768, 65536)
PAPER_SOURCE = "EndPrompt paper, Tables 1, 2, 5"
#: Averages published in the paper (as transcribed in the task statement): method -> table ->
#: average.
PAPER: dict[str, dict[str, float]] = {
    "EndPrompt": {"ruler_4k_64k": 76.03, "longbench": 38.30, "short_text": 53.56},
    "full-length fine-tuning": {"ruler_4k_64k": 69.23},
    "LCEG": {"ruler_4k_64k": 72.24},
    "LongLoRA": {"ruler_4k_64k": 72.95},
    "PoSE": {"ruler_4k_64k": 78.91},
}


def ruler_paper_average(tasks: dict[str, Any]) -> dict[str, Any]:
    """RULER's average over the 13 tasks: per length (tasks run), then over 4K-64K.

    ``tasks``: ``{task: {"scores": {"4096": 0-100, ...}}}``. Returns ``{"per_length",
    "average_4k_64k", "missing_tasks", "missing_lengths", "comparable"}``; the 4K-64K average
    uses the paper lengths that have a score."""
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
            "missing_tasks": missing_tasks, "missing_lengths": missing_lengths,
            "comparable": not missing_tasks and not missing_lengths}


def _f(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _paper_cells(table: str) -> str:
    return "; ".join(f"{m} {nums[table]:.2f}" for m, nums in PAPER.items() if table in nums)


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
    rows += ["", f"4K-64K average (ours): {_f(avg['average_4k_64k'])}"]
    if avg["comparable"]:
        rows.append(f"Paper's 4K-64K averages ({PAPER_SOURCE}): {_paper_cells('ruler_4k_64k')}")
    else:
        rows.append("Not comparable with the paper's 4K-64K average (13 tasks x 4K-64K): "
                    f"missing tasks {', '.join(avg['missing_tasks']) or 'none'}; missing "
                    f"lengths {', '.join(map(str, avg['missing_lengths'])) or 'none'}.")
    return rows


def _longbench_table(lb: dict[str, Any]) -> list[str]:
    rows = [f"### LongBench (English, context {lb['length']}, prompts cut to "
            f"{lb['max_prompt_tokens']} tokens)", "", "| category | tasks | score |",
            "|---|---|---|"]
    for cat, members in CATEGORIES.items():
        cells = ", ".join(f"{t} {_f(lb['tasks'][t])}" for t in members if t in lb["tasks"])
        rows.append(f"| {cat} | {cells or 'not run'} | {_f(lb['categories'][cat])} |")
    rows.append(f"| average over categories | | {_f(lb['average'])} |")
    rows.append("")
    if lb["complete"]:
        rows.append(f"Paper's LongBench average ({PAPER_SOURCE}): {_paper_cells('longbench')}")
    else:
        rows.append(f"Not comparable with the paper's average: missing {', '.join(lb['missing'])}.")
    rows.append("Chinese tasks not run (jieba segmentation not carried): "
                + ", ".join(lb["skipped_chinese"]) + ".")
    return rows


def _short_table(st: dict[str, Any]) -> list[str]:
    rows = ["### Short-text retention", "", "| benchmark | metric | shots | score |",
            "|---|---|---|---|"]
    for b in BENCHMARKS:
        e = st["benchmarks"].get(b)
        rows.append(f"| {b} | {e['metric']} | {e['num_fewshot']} | {_f(e['score'])} |" if e
                    else f"| {b} | | | not run |")
    rows += [f"| average | | | {_f(st['average'])} |", ""]
    if st["complete"]:
        rows.append(f"Paper's short-text average ({PAPER_SOURCE}): {_paper_cells('short_text')}"
                    " (the paper's after an SFT phase)")
    else:
        rows.append(f"Not comparable with the paper's average: missing {', '.join(st['missing'])}.")
    return rows


def paper_tables(results: dict[str, Any]) -> str:
    """Markdown of the three tables (each only when its evaluation ran); ``""`` when none."""
    parts = [_ruler_table(results)]
    if results.get("longbench"):
        parts.append(_longbench_table(results["longbench"]))
    if results.get("short_text"):
        parts.append(_short_table(results["short_text"]))
    blocks = ["\n".join(p) for p in parts if p]
    if not blocks:
        return ""
    return ("\n## Paper layout\n\nNumbers marked \"Paper's\" are published in the "
            f"{PAPER_SOURCE}, not measured here; they compare only when the model and training "
            "setting match.\n\n" + "\n\n".join(blocks) + "\n")
