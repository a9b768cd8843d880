"""The length-grid table (``benchmarks.replication.grid``) renders from the committed results
JSONs alone, each cell equal to that JSON's own summary; two results for one ``L`` are
refused."""

from __future__ import annotations

import os

import pytest

from benchmarks.replication import grid, stats

RESULTS = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "replication", "results")
FILES = [os.path.join(RESULTS, f) for f in ("mini_replication_L640_all_seed0.json",
                                            "mini_replication_grid_seed0_L1280.json")]


def test_grid_cells_are_the_results_own_cells(tmp_path):
    runs = grid.load(list(reversed(FILES)))
    assert [r["config"]["L"] for r in runs] == [640, 1280]  # sorted by L
    text = grid.table(runs)
    d1280 = runs[1]["summary"]["d"]["passkey"]
    want = f"{stats.fmt_cell(d1280['640'])} / {stats.fmt_cell(d1280['1280'])}"
    row = next(line for line in text.splitlines() if line.startswith("| (d) EndPrompt random"))
    assert row.split(" | ")[-1].rstrip(" |") == want
    diff = runs[1]["paired"]["d-d0"]["passkey"]["1280"]["mean"]
    assert any(line.startswith("| (d) - (d0) | passkey") and f"{100 * diff:+.0f} (1 seed)"
               in line for line in text.splitlines())
    assert grid.main([str(tmp_path / "g"), *FILES]) == 0
    assert (tmp_path / "g.md").read_text().startswith("| method |")


def test_two_results_for_one_length_are_refused():
    with pytest.raises(SystemExit, match="error: two results for the same L"):
        grid.load([FILES[0], FILES[0]])
