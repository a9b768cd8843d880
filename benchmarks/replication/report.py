"""Tables and figure of the mini-replication, from its results JSON only (so a committed JSON
re-renders them: ``python -m benchmarks.replication.report RESULTS.json``).

Main table: one row per method (the base at ``s = 1`` first), accuracy per task and length as
``mean [95% interval]`` in percent (intervals: ``stats``), PPL per length, tokens
per step, step time and peak RSS relative to full-length fine-tuning (b). Sweep table: the best
placement with one knob changed, on each seed, and its difference from the default paired by
seed. Figure: accuracy against length per method (sweep variants dotted) with interval bands
(one panel per task) and PPL against length.
"""

from __future__ import annotations

import json
import os
import sys

from benchmarks.replication import stats
from megatron_endprompt.disk import atomic_path, write_text

TASKS = ("niah_single_1", "passkey")
#: Held-out RULER tasks (no fine-tuning document holds them); shown where the JSON has them.
HELD_OUT = ("niah_multikey_2", "niah_multivalue", "niah_multiquery")
SHORT = {"niah_single_1": "NIAH (in-dist.)", "passkey": "passkey (in-dist.)",
         "niah_multikey_2": "MK2 (held-out)", "niah_multivalue": "MV (held-out)",
         "niah_multiquery": "MQ (held-out)"}


def _tasks(results: dict) -> tuple[str, ...]:
    """The in-distribution tasks, then the held-out ones any method was evaluated on."""
    have = {t for s in results["summary"].values() for t in s}
    return TASKS + tuple(t for t in HELD_OUT if t in have)


def _mean(entries: list[dict], key: str) -> float | None:
    vals = [e[key] for e in entries if e.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def _lengths(results: dict) -> list[str]:
    return [n.strip() for n in str(results["config"]["lengths"]).split(",")]


def main_table(results: dict) -> str:
    lengths, summ, tasks = _lengths(results), results["summary"], _tasks(results)
    ref_m = next((m for m in ("b", "hd", "hg") if m in results["methods"]), "b")
    head = ["method", "tokens/step", f"step vs ({ref_m})", f"RSS vs ({ref_m})"]
    head += [f"{SHORT[t]} {n}" for t in tasks for n in lengths]
    head += [f"PPL {n}" for n in lengths]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ref = list(results["methods"].get(ref_m, {}).get("seeds", {}).values())
    ref_step, ref_rss = _mean(ref, "step_ms"), _mean(ref, "peak_rss_mib")

    def row(label: str, s: dict, entries: list[dict]) -> str:
        step, rss = _mean(entries, "step_ms"), _mean(entries, "peak_rss_mib")
        tps = entries[0].get("tokens_per_step") if entries else None
        cells = [label, f"{tps:,}" if tps else "-",
                 f"{step / ref_step:.2f}x" if step and ref_step else "-",
                 f"{rss / ref_rss:.2f}x" if rss and ref_rss else "-"]
        cells += [stats.fmt_cell(s.get(t, {}).get(n)) for t in tasks for n in lengths]
        ppl = s.get("ppl", {})
        cells += [f"{ppl[n]['mean']:.2f}" if n in ppl else "n/a" for n in lengths]
        return "| " + " | ".join(cells) + " |"
    rows.append(row("base, s=1 (no PI)", summ["base"], []))
    for m, e in results["methods"].items():
        rows.append(row(f"({m}) {e['name']}", summ[m], list(e["seeds"].values())))
    return "\n".join(rows)


def data_table(results: dict) -> str:
    """What each row's training data holds (``data_stats.py``): documents per step and the
    share of documents whole inside one training sample, with the tokens per step and steps."""
    data = results.get("data") or {}
    if not data:
        return ""
    rows = ["| method | tokens/step | steps | sample window | documents/step | "
            "whole documents in one sample |", "|---|---|---|---|---|---|"]
    for m, e in results["methods"].items():
        st = data.get(m)
        if not st:
            continue
        runs = list(e["seeds"].values())
        tps, steps = runs[0].get("tokens_per_step"), runs[0].get("steps")
        share = st.get("whole_doc_share")
        rows.append(f"| ({m}) {e['name']} | {f'{tps:,}' if tps else '-'} | {steps or '-'} | "
                    f"{st['window']} | {st['docs_per_step']:g} | "
                    + (f"{100 * share:.1f}%" if share is not None else
                       "- (first a + last b of each)") + " |")
    return "\n".join(rows)


def paired_table(results: dict) -> str:
    """Differences of accuracy paired by seed (points, Student-t 95% interval, paired t-test p
    and its Holm-adjusted p over the whole table; bold: resolved after Holm)."""
    paired = results.get("paired") or {}
    if not paired:
        return ""
    rows = [DIFF_HEAD, DIFF_RULE]
    for name, by_task in paired.items():
        for t, by_len in by_task.items():
            for n, d in by_len.items():
                if d is not None:
                    rows.append(diff_row(stats.pair_label(name), t, n, d))
    return "\n".join(rows)


#: Columns of every table of paired differences (one Holm family per table).
DIFF_HEAD = ("| difference | task | length | mean (points) | 95% t interval | p | Holm p | "
             "seeds |")
DIFF_RULE = "|---|---|---|---|---|---|---|---|"


def diff_row(label: str, task: str, length: str, d: dict) -> str:
    """One paired difference of accuracy (:func:`stats.diff_row`)."""
    return stats.diff_row([label, SHORT.get(task, task), length], d)


def sweep_table(results: dict) -> str:
    """The sweep's accuracy table (the default row is the main table's runs of the same
    seeds), then each variant's difference from the default, paired by seed."""
    sw = results.get("sweep")
    if not sw:
        return ""
    L, L0 = str(results["config"]["L"]), str(results["config"]["L0"])
    m, d = sw["placement"], sw["default"]
    seeds = sw.get("seeds", 1)
    head = ["run", *(f"{SHORT[t]} {n}" for t in TASKS for n in (L0, L)), f"PPL {L}"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    main = results["methods"].get(m, {}).get("seeds", {})
    default_runs = {k: v for k, v in main.items() if k in {str(i) for i in range(seeds)}}
    entries = [(f"({m}) b={d['terminal']}, w={d['w']:g}, s={d['s']} (main table)",
                stats.summarize(default_runs, TASKS) if default_runs else None)]
    entries += [(f"({m}) {label}", r["summary"]) for label, r in sw["runs"].items()]
    for label, s in entries:
        if s is None:
            continue
        cells = [label] + [stats.fmt_cell(s.get(t, {}).get(n)) for t in TASKS for n in (L0, L)]
        ppl = s.get("ppl", {}).get(L)
        cells.append(f"{ppl['mean']:.2f}" if ppl else "n/a")
        rows.append("| " + " | ".join(cells) + " |")
    diffs = ["", DIFF_HEAD.replace("difference", "variant - default"), DIFF_RULE]
    for label, r in sw["runs"].items():
        for t in TASKS:
            for n in (L0, L):
                p = r.get("paired", {}).get(t, {}).get(n)
                if p:
                    diffs.append(diff_row(f"({m}) {label}", t, n, p))
    return "\n".join(rows + (diffs if len(diffs) > 3 else []))


def notes(results: dict) -> str:
    c, t = results["config"], results.get("timings_s", {})
    seeds = results.get("seeds_done", c["seeds"])
    interval = ("Student-t 95% interval over the seeds (SciPy)" if seeds > 1
                else "Wilson 95% interval of the cell")
    return (f"L0={c['L0']}, L={c['L']} (s={c['ratio']}), P={c['P']}; {c['ft_iters']} "
            f"fine-tuning steps x {c['ft_docs']} documents per method, LR {c['ft_lr']:g}; "
            f"EndPrompt b={c['terminal']}, w={c['w']:g} (prompt terminal w={c['prompt_w']:g}); "
            f"{seeds} seed(s)"
            + (f" of {c['seeds']} (partial)" if "seeds_done" in results else "")
            + f". Accuracy in % over {c['samples']} prompts per cell (NIAH: "
            f"RULER niah_single_1; passkey: landmark, {max(1, c['samples'] // 5)} x 5 "
            f"depths), mean [{interval}]; PPL: per-document "
            f"sliding window on {c['ppl_docs']} held-out documents (mean over seeds). Base: "
            f"{c['base_iters']} + {sum(c.get('base_more', []))} "
            f"steps at L0. Wall time {t.get('total_s', 0) / 60:.1f} min "
            f"(base {t.get('base_s', 0) / 60:.1f} min, "
            + ", ".join(f"{k[:-2]} {v / 60:.1f} min" for k, v in t.items()
                        if k.startswith("seed") or k == "sweep_s") + ").")


def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend, or ``None`` (with one warning line)
    where matplotlib is not installed: the tables are written either way."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("warning: matplotlib is not installed; no figure", file=sys.stderr)
        return None
    return plt


def save_figure(fig, path: str) -> str:
    """Write ``fig`` (made by ``pyplot()``) as PNG to ``path`` through a temporary (an
    interrupted write leaves the previous figure intact) and close it."""
    import matplotlib.pyplot as plt  # already imported by pyplot(): no cost

    with atomic_path(path, fsync=False) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


def figure(results: dict, path: str) -> str | None:
    """Accuracy vs length per method (and per sweep variant, dotted) with interval bands (a
    panel per task) + PPL vs length."""
    plt = pyplot()
    if plt is None:
        return None
    lengths = [int(n) for n in _lengths(results)]
    summ = results["summary"]
    # (label, summary, line style): the base dashed, the methods solid, sweep variants dotted
    curves = [("base, s=1", summ["base"], "--")]
    curves += [(f"({m}) {e['name']}", summ[m], "-") for m, e in results["methods"].items()]
    if "sweep" in results:
        place = results["sweep"]["placement"]
        curves += [(f"({place}) {label}", r["summary"], ":")
                   for label, r in results["sweep"]["runs"].items()]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for ax, task in zip(axes, TASKS):
        for label, sm, style in curves:
            cells = [sm.get(task, {}).get(str(n)) for n in lengths]
            xs = [n for n, cl in zip(lengths, cells) if cl]
            if not xs:
                continue
            mean = [100 * cl["mean"] for cl in cells if cl]
            lo = [100 * cl["shown"][0] for cl in cells if cl]
            hi = [100 * cl["shown"][1] for cl in cells if cl]
            (line,) = ax.plot(xs, mean, style, marker="o", label=label)
            ax.fill_between(xs, lo, hi, alpha=0.15, color=line.get_color())
        ax.set(xscale="log", xlabel="context length (tokens)", ylabel="accuracy (%)",
               ylim=(-3, 103), title=f"{SHORT[task]} ({task})")
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xticks([], minor=True)  # a log axis' minor labels collide with the lengths
        ax.axvline(results["config"]["L0"], color="grey", lw=0.8, ls=":")
    ax = axes[2]
    for label, sm, style in curves:
        ppl = sm.get("ppl", {})
        xs = [n for n in lengths if str(n) in ppl]
        if xs:
            ax.plot(xs, [ppl[str(n)]["mean"] for n in xs], style, marker="o", label=label)
    ax.set(xscale="log", xlabel="context length (tokens)", ylabel="PPL",
           title="held-out PPL")
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xticks([], minor=True)
    handles, names = axes[0].get_legend_handles_labels()  # below the panels: no line hidden
    ncol = max(1, min(5, len(names)))
    fig.legend(handles, names, fontsize=8, loc="lower center", ncol=ncol)
    c = results["config"]
    fig.suptitle(f"Mini-replication: L0={c['L0']} -> L={c['L']} (s={c['ratio']}), "
                 f"{results.get('seeds_done', c['seeds'])} seed(s), {c['samples']} prompts/cell, "
                 "95% bands")
    fig.tight_layout(rect=(0, 0.05 * -(-len(names) // ncol), 1, 1))  # room for the legend
    return save_figure(fig, path)


def write_all(results: dict, out_json: str) -> list[str]:
    """``.md`` (tables + notes) and ``.png`` beside ``out_json``; returns the paths."""
    stem = os.path.splitext(out_json)[0]
    text = main_table(results) + "\n\n" + notes(results) + "\n"
    dt = data_table(results)
    if dt:
        text += "\nTraining data per row:\n\n" + dt + "\n"
    paired = paired_table(results)
    if paired:
        text += ("\nDifferences paired by seed (same evaluation prompts per seed; paired "
                 "t-test, Holm's correction over this table; bold: Holm p < 0.05):\n\n") + \
            paired + "\n"
    sw = sweep_table(results)
    if sw:
        n = results["sweep"].get("seeds", 1)
        text += (f"\nSweep on the best placement ({results['sweep']['placement']}), {n} "
                 f"seed(s):\n\n" + sw + "\n")
    write_text(stem + ".md", text)
    out = [stem + ".md"]
    png = figure(results, stem + ".png")
    if png:
        out.append(png)
    return out


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        res = json.load(f)
    print("wrote " + ", ".join(write_all(res, sys.argv[1])))
