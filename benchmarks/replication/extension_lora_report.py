"""Statistics and tables of the LoRA block of the extension protocol (``extension_lora.py``),
from its results JSON only (``--rerender RESULTS.json`` rewrites them).

Per arm and seed: held-out perplexity at ``L0`` and ``L``, NIAH / passkey at ``L0`` and ``L``
and their ``retention`` (score(L) - score(L0)), the trainable parameters, the training's peak
RSS and its step time. Between arms, paired by seed (same data, same order, same steps): the
LoRA arm against full EndPrompt, as a ratio for perplexity, step time and memory (the mean of
the per-seed log ratios, shown as ``exp``: a geometric-mean ratio with its interval) and as a
difference in points for retention; Student-t 95% intervals and paired t-tests
(``stats.paired_summary``, SciPy), Holm over the whole table (``stats.holm_family``).
"""

from __future__ import annotations

import math
import os

from benchmarks.replication import stats
from megatron_endprompt.disk import write_text

TASKS = ("niah_single_1", "passkey")
SHORT = {"niah_single_1": "NIAH", "passkey": "passkey"}
#: Paired quantities: (key, what the table calls it, ``ratio`` (log ratio, shown as x) or
#: ``points`` (difference of fractions, shown in points)).
QUANTITIES = (("ppl_L0", "held-out PPL @L0", "ratio"), ("ppl_L", "held-out PPL @L", "ratio"),
              ("niah_single_1_retention", "NIAH retention", "points"),
              ("passkey_retention", "passkey retention", "points"),
              ("step_ms", "step time", "ratio"), ("peak_rss_mib", "peak RSS (host)", "ratio"))


def _lengths(results: dict) -> tuple[str, str]:
    c = results["config"]
    return str(c["L0"]), str(c["L"])


def values(results: dict, entry: dict) -> dict[str, float]:
    """The per-run numbers of one evaluated model (an arm's seed or a reference): held-out
    PPL, scores and retention per task, and (trained runs) step time and peak RSS."""
    L0, L = _lengths(results)
    out: dict[str, float] = {}
    for n, key in ((L0, "ppl_L0"), (L, "ppl_L")):
        p = (entry.get("ppl") or {}).get(n) or {}
        if p.get("ppl") is not None:
            out[key] = p["ppl"]
    for t in TASKS:
        counts = entry["counts"].get(t, {})
        if counts.get(L0, [0, 0])[1] and counts.get(L, [0, 0])[1]:
            a0, a1 = counts[L0][0] / counts[L0][1], counts[L][0] / counts[L][1]
            out.update({f"{t}_L0": a0, f"{t}_L": a1, f"{t}_retention": a1 - a0})
    for key in ("step_ms", "peak_rss_mib"):
        if entry.get(key):
            out[key] = float(entry[key])
    return out


def per_seed(results: dict, arm: str) -> dict[str, dict[str, float]]:
    """``{seed: values}`` of one arm."""
    return {s: values(results, e) for s, e in results["arms"][arm]["seeds"].items()}


def paired(x: dict[str, dict], y: dict[str, dict], key: str, kind: str) -> dict | None:
    """Per-seed ``x - y`` of one quantity (``log x - log y`` for a ``ratio``) over the seeds
    both arms have, with its Student-t interval and p (``stats.paired_summary``)."""
    seeds = sorted((s for s in set(x) & set(y) if key in x[s] and key in y[s]), key=int)
    if kind == "ratio":
        diffs = [math.log(x[s][key]) - math.log(y[s][key]) for s in seeds]
    else:
        diffs = [x[s][key] - y[s][key] for s in seeds]
    return {**stats.paired_summary(diffs), "seeds": seeds} if diffs else None


def iteration1_equal(results: dict, x: str, y: str) -> dict[str, bool]:
    """Per shared seed: whether both arms logged the same loss at iteration 1 (``B = 0``: the
    same model, so the same data and order give the same first loss)."""
    a, b = results["arms"][x]["seeds"], results["arms"][y]["seeds"]
    return {s: a[s]["losses"].get("1") == b[s]["losses"].get("1") for s in sorted(
        set(a) & set(b), key=int)}


def summarize(results: dict, pairs) -> None:
    """``results["summary"]`` (per arm: each quantity's mean and t interval over seeds, in
    its own scale; PPL as a geometric mean) and ``results["paired"]`` (one Holm family), in
    place."""
    summary: dict = {}
    for arm in results["arms"]:
        ps = per_seed(results, arm)
        keys = sorted({k for v in ps.values() for k in v})
        summary[arm] = {k: _cell([v[k] for v in ps.values() if k in v], log=k.startswith("ppl"))
                        for k in keys}
    results["summary"] = summary
    fam: dict = {}
    for x, y in pairs:
        if x in results["arms"] and y in results["arms"]:
            px, py = per_seed(results, x), per_seed(results, y)
            for key, _, kind in QUANTITIES:
                d = paired(px, py, key, kind)
                if d:
                    fam.setdefault(f"{x}-{y}", {})[key] = d
            fam.setdefault(f"{x}-{y}", {})["iteration1_equal"] = iteration1_equal(results, x, y)
    stats.holm_family([d for by in fam.values() for k, d in by.items()
                       if k != "iteration1_equal"])
    results["paired"] = fam


def _cell(vals: list[float], *, log: bool) -> dict:
    """Mean and Student-t 95% interval; ``log``: of the logs, returned as ``exp`` (geometric
    mean and its interval)."""
    d = stats.paired_summary([math.log(v) for v in vals] if log else vals)
    if log:
        return {"mean": math.exp(d["mean"]), "per_seed": vals,
                "t95": [math.exp(v) for v in d["t95"]] if d["t95"] else None}
    return {"mean": d["mean"], "per_seed": vals, "t95": d["t95"]}


def fmt(c: dict | None, spec: str, scale: float = 1.0) -> str:
    """``mean [lo, hi]`` with ``spec`` (a format spec) after ``scale``."""
    if not c:
        return "n/a"
    m = format(scale * c["mean"], spec)
    if not c.get("t95"):
        return m
    lo, hi = (format(scale * v, spec) for v in c["t95"])
    return f"{m} [{lo}, {hi}]"


def fmt_paired(d: dict, kind: str) -> tuple[str, str]:
    """(mean, interval) of a paired cell: ``x0.97`` / ``[x0.95, x0.99]`` for a ratio, signed
    points for a difference."""
    if kind == "ratio":
        mean = f"x{math.exp(d['mean']):.3f}"
        ci = (f"[x{math.exp(d['t95'][0]):.3f}, x{math.exp(d['t95'][1]):.3f}]" if d.get("t95")
              else "n/a (1 seed)")
        return mean, ci
    return f"{100 * d['mean']:+.1f}", stats.fmt_interval(d)


def arms_table(results: dict) -> str:
    L0, L = _lengths(results)
    head = ["row", "trainable parameters", "peak RSS, MiB (host)", "step, ms",
            f"PPL @{L0}", f"PPL @{L}"]
    for t in TASKS:
        head += [f"{SHORT[t]} @{L0}", f"{SHORT[t]} @{L}"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for ref, label in (("base_s1", "base, s=1 (no PI)"), ("base_pi", "PI only (no training)")):
        e = results["references"][ref]
        v = values(results, e)
        cells = [label, "-", "-", "-"] + [f"{v[k]:.2f}" if k in v else "n/a"
                                          for k in ("ppl_L0", "ppl_L")]
        cells += [f"{100 * v[f'{t}_{n}']:.1f}" for t in TASKS for n in ("L0", "L")]
        rows.append("| " + " | ".join(cells) + " |")
    for arm, e in results["arms"].items():
        s = results["summary"].get(arm, {})
        runs = list(e["seeds"].values())
        p = runs[0]["params"] if runs else None
        share = f"{p['trainable']:,} ({100 * p['trainable'] / p['base']:.1f}% of {p['base']:,})" \
            if p else "-"
        cells = [f"({arm}) {e['label']}", share, fmt(s.get("peak_rss_mib"), ".0f"),
                 fmt(s.get("step_ms"), ".0f"), fmt(s.get("ppl_L0"), ".2f"),
                 fmt(s.get("ppl_L"), ".2f")]
        cells += [fmt(s.get(f"{t}_{n}"), ".1f", 100) for t in TASKS for n in ("L0", "L")]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def paired_table(results: dict) -> str:
    rows = ["| difference | quantity | mean | 95% t interval | p | Holm p | seeds |",
            "|---|---|---|---|---|---|---|"]
    names = {k: (name, kind) for k, name, kind in QUANTITIES}
    for pair, by in results["paired"].items():
        for key, d in by.items():
            if key == "iteration1_equal":
                continue
            name, kind = names[key]
            rows.append(stats.diff_row([stats.pair_label(pair), name], d,
                                       *fmt_paired(d, kind)))
    return "\n".join(rows)


def notes(results: dict) -> str:
    c, h = results["config"], results["heldout"]
    done = results.get("seeds_done", c["seeds"])
    eq = {p: f"{sum(v['iteration1_equal'].values())}/{len(v['iteration1_equal'])}"
          for p, v in results["paired"].items()}
    last = h["first_speech"] + h["speeches"] - 1
    lrs = ", ".join(f"{next(iter(e['seeds'].values()))['lr']:g} ({k})"
                    for k, e in results["arms"].items() if e["seeds"])
    return (
        f"L0 = {c['L0']}, L = {c['L']} (PI s = {c['L'] // c['L0']}), P = {c['P']}; the "
        f"extension protocol's cached base (hidden {c['hidden']}, {c['layers']} layers, "
        f"vocabulary {c['vocab']}). Every arm: the (ep1f) row's data (EP1 prompt terminal, fixed "
        f"placement, w = {c['prompt_w']:g}, its sidecar per seed) through Megatron's pretrain "
        f"(`--finetune` from the base, {c['nproc']} CPU rank), {c['ft_iters']} steps x "
        f"{c['ft_docs']} x P = {c['ft_docs'] * c['P']} tokens per step, warm-up "
        f"{c['ft_warmup']} then cosine to LR/10, seed 1000 + seed (data order); LoRA r = "
        f"{c['lora_rank']}, alpha = {c['lora_alpha']:g}, dropout 0, on "
        f"{', '.join(c['lora_targets'])}; peak LR {lrs}. Iteration-1 "
        f"loss equal (same data, B = 0): {', '.join(f'{p}: {v}' for p, v in eq.items())} seeds. "
        f"Exported merged with PI (`convert megatron-to-hf --target-length {c['L']} "
        f"--pi-factor {c['L'] // c['L0']}`). Held-out PPL: {h['docs']} documents of "
        f"{c['ppl_doc_tokens']} tokens (speeches {h['first_speech']}..{last} of the corpus' "
        f"fine-tuning share, after the last the fine-tuning text holds; the base never read "
        f"that share), windows every {c['ppl_stride']} tokens, "
        f"each token scored once; geometric mean [t 95%] over seeds. Retrieval: "
        f"{c['samples']} prompts per task and length, % [t 95%]. Trainable parameters: the "
        f"elements of Adam's first moment in the saved checkpoint (share of the base's "
        f"parameters). Peak RSS: `ru_maxrss` of `RUSAGE_CHILDREN` of the training's process "
        f"tree (host memory on CPU: the largest process, runtime included). Step time: median "
        f"of Megatron's logged per-iteration time, iterations 2..{c['ft_iters']}, on a shared "
        f"2-core machine; the arms' order rotates with the seed. {done} of {c['seeds']} "
        f"seed(s).")


def write_md(results: dict, out_json: str) -> str:
    """The tables beside ``out_json``; returns the path."""
    path = os.path.splitext(out_json)[0] + ".md"
    text = (arms_table(results) + "\n\n" + notes(results) + "\n\n"
            "Paired by seed, LoRA arm against full EndPrompt: ratios (geometric mean of the "
            "per-seed ratios) for PPL, step time and memory, points for retention; paired "
            "t-test, Holm over this table; bold: Holm p < 0.05:\n\n" + paired_table(results)
            + "\n")
    write_text(path, text)
    return path
