"""The b/w/s sweep of the mini-replication runs every variant on every seed of the main table
and reports each variant's difference from the default paired by seed (one run
per seed was not enough); before, it ran seed 0 only, one run inside a seed-to-seed sd of ~10
points."""

from __future__ import annotations

import pytest

from benchmarks.replication import mini_replication, report, stats, sweep

C = {"terminal": 64, "w": 1.0, "ratio": 2, "sweep_b": [32, 80], "lengths": "320,640",
     "L": 640, "L0": 320}
TASKS = ("niah_single_1", "passkey")


def entry(seed: int, k: int) -> dict:
    """One evaluated run: ``k`` of 100 right in every cell."""
    return {"counts": {t: {"320": [k, 100], "640": [k - seed, 100]} for t in TASKS},
            "ppl": {"640": 3.0}}


def test_every_variant_runs_on_every_seed_paired_with_the_default():
    calls = []

    def method(m, seed, *, tag, **kw):
        calls.append((m, seed, tag, tuple(sorted(kw.items()))))
        return entry(seed, 50 + 10 * seed + (5 if "w" in kw else 0))

    default = {str(s): entry(s, 50 + 10 * s) for s in range(3)}
    rec = sweep.run_sweep(method, C, default, "d", 3, TASKS)
    assert sorted(rec["runs"]) == ["b=32", "b=80", "s=4", "w=0.1"]
    assert len(calls) == 4 * 3 and {c[1] for c in calls} == {0, 1, 2}
    # seed 0 keeps the one-seed sweep's cache tag, so --resume reuses it
    assert ("d", 0, "sweep_d_w0p1", (("w", 0.1),)) in calls
    assert ("d", 2, "sweep_d_w0p1_seed2", (("w", 0.1),)) in calls
    assert len({c[2] for c in calls}) == 12
    p = rec["runs"]["w=0.1"]["paired"]["passkey"]["640"]
    assert p["per_seed"] == pytest.approx([0.05] * 3) and p["t95"] == pytest.approx([0.05, 0.05])
    assert rec["runs"]["b=32"]["paired"]["passkey"]["640"]["mean"] == pytest.approx(0.0)
    assert rec["runs"]["s=4"]["summary"]["passkey"]["640"]["per_seed"] == \
        pytest.approx([0.5, 0.59, 0.68])

    results = {"config": {"L": 640, "L0": 320}, "sweep": rec,
               "methods": {"d": {"seeds": {**default, "3": entry(3, 99)}}}}
    text = report.sweep_table(results)
    assert "(d) b=64, w=1, s=2 (main table)" in text
    head = "| (d) w=0.1 | passkey (in-dist.) | 640 |"
    row = next(r for r in text.splitlines() if r.startswith(head))
    # the same +5 on every seed: resolved after Holm over the sweep's table, so bold
    assert row.startswith(head + " **+5.0** | **[+5.0, +5.0]** |")
    assert row.endswith("| 3 |")
    # the default row averages the sweep's seeds only, not the main table's extra seed 3
    assert "| (d) b=64, w=1, s=2 (main table) | 60 [" in text  # 50, 60, 70; not 99


def test_sweep_without_c_or_d_is_refused_before_any_work(capsys):
    with pytest.raises(SystemExit, match="error: --sweep .* add c or d to --methods"):
        mini_replication.main(["--smoke", "--sweep", "--methods", "b"])


def test_figure_draws_each_sweep_variant_dotted(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    default = {str(s): entry(s, 50 + 10 * s) for s in range(3)}
    rec = sweep.run_sweep(lambda m, seed, *, tag, **kw: entry(seed, 40), C, default, "d", 3,
                          TASKS)
    results = {"config": {**C, "seeds": 3, "samples": 100}, "sweep": rec,
               "methods": {"d": {"name": "EndPrompt random", "seeds": default}},
               "summary": {"base": stats.summarize({"0": entry(0, 90)}, TASKS),
                           "d": stats.summarize(default, TASKS)}}
    drawn = {}

    def keep(fig, path):
        drawn["fig"] = fig
        return path

    monkeypatch.setattr(report, "save_figure", keep)
    assert report.figure(results, str(tmp_path / "f.png"))
    for ax in drawn["fig"].axes[:3]:
        styles = [(ln.get_label(), ln.get_linestyle()) for ln in ax.get_lines()
                  if not ln.get_label().startswith("_")]
        assert sorted(lab for lab, st in styles if st == ":") == \
            ["(d) b=32", "(d) b=80", "(d) s=4", "(d) w=0.1"]
        assert ("(d) EndPrompt random", "-") in styles and ("base, s=1", "--") in styles
