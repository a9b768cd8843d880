"""The replication's statistics against SciPy and a hand-worked Holm example: intervals for any
number of seeds (not a z fallback beyond a short table), paired t-test p-values, and Holm's
step-down correction that decides what a difference table prints in bold."""

from __future__ import annotations

import pytest
from scipy import stats as sps

from benchmarks.replication import report
from benchmarks.replication import stats


def _values(n: int) -> list[float]:
    return [((7 * i) % 11) / 10 - 0.3 for i in range(n)]  # spread, not all equal


@pytest.mark.parametrize("n", range(2, 31))
def test_paired_interval_is_scipys_t_interval(n):
    diffs = _values(n)
    d = stats.paired_summary(diffs)
    want = sps.t.interval(0.95, n - 1, loc=sps.tmean(diffs), scale=sps.sem(diffs))
    assert d["t95"] == pytest.approx(list(want), rel=1e-9, abs=1e-12)
    assert d["p"] == pytest.approx(sps.ttest_1samp(diffs, 0.0).pvalue, rel=1e-9)


@pytest.mark.parametrize("n", range(2, 31))
def test_cell_interval_is_scipys_t_interval(n):
    accs = [0.3 + 0.4 * ((5 * i) % 7) / 7 for i in range(n)]
    lo, hi = stats.t_interval(accs)
    want = sps.t.interval(0.95, n - 1, loc=sps.tmean(accs), scale=sps.sem(accs))
    assert (lo, hi) == pytest.approx((max(0.0, want[0]), min(1.0, want[1])), rel=1e-9)


def test_holm_by_hand():
    # p = (0.01, 0.04, 0.03, 0.005), m = 4. Sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03,
    # 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> 0.06 (monotone). None is not in the family.
    adj = stats.holm([0.01, 0.04, None, 0.03, 0.005])
    assert adj[2] is None
    assert adj[0] == pytest.approx(0.03) and adj[4] == pytest.approx(0.02)
    assert adj[3] == pytest.approx(0.06) and adj[1] == pytest.approx(0.06)
    assert stats.holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # capped at 1


def test_only_what_survives_holm_is_bold():
    strong = stats.paired_summary([0.30, 0.32, 0.28, 0.31, 0.29])  # p ~ 1e-6
    weak = stats.paired_summary([0.10, -0.02, 0.12, 0.08, 0.01])   # p ~ 0.05 alone
    stats.holm_family([strong, weak])
    assert stats.resolved(strong) and not stats.resolved(weak)
    table = report.paired_table({"paired": {"d-b": {"passkey": {"640": strong}},
                                            "e-d": {"passkey": {"640": weak}}}})
    rows = table.splitlines()
    assert "| **+30.0** |" in rows[2] and "**[" in rows[2]
    assert "**" not in rows[3]
    assert "Holm p" in rows[0]
