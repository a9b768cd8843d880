"""The reliability sweep as tests: every case of ``sweep_cases`` (>= 60 bad inputs and faults over
preprocess, inspect, convert, eval and the pretrain entry's start-up) must give the expected
exit code, exactly one ``error:`` line, no traceback, no partial output and leave the previous
dataset/checkpoint/export byte-identical (see ``sweep.py`` for the exact outcome flags).

Fixtures are built once per module; tools run in-process through ``run_cli``; the pretrain
cases share one process that stops each run before Megatron's ``pretrain()``.
"""

from __future__ import annotations

import pytest
from sweep import COUNT_KEYS, run_case
from sweep_cases import CASES, run_pretrain_cases

pytestmark = pytest.mark.e2e

IN_PROCESS = [c for c in CASES if c.tool != "pretrain"]
PRETRAIN = [c for c in CASES if c.tool == "pretrain"]


@pytest.fixture(scope="module")
def pretrain_results(fx, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("sweep_pretrain"))
    return {r["name"]: r for r in run_pretrain_cases(PRETRAIN, fx, root)}


def _explain(r: dict) -> str:
    flags = [k for k in COUNT_KEYS[1:] if r[k]]
    return (f"{r['name']}: rc={r['rc']} flags={flags} error_lines={r['error_lines']} "
            f"new={r['new_files']} changed={r['changed']}\n{r['stderr_tail']}")


def test_sweep_is_large_and_covers_every_tool():
    assert len(CASES) >= 60
    # the planner's refusals are its own test's (tests/planning/test_launch_vars.py)
    assert {c.tool for c in CASES} == {"preprocess", "inspect", "convert", "eval", "pretrain",
                                       "merge", "sidecar", "launch"}
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", IN_PROCESS, ids=[c.name for c in IN_PROCESS])
def test_case(case, fx, tmp_path):
    r = run_case(case, fx, str(tmp_path))
    assert r["one_line"], _explain(r)


@pytest.mark.parametrize("case", PRETRAIN, ids=[c.name for c in PRETRAIN])
def test_pretrain_startup_case(case, pretrain_results):
    r = pretrain_results[case.name]
    assert r["one_line"], _explain(r)
