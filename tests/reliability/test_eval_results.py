"""Evaluation results survive — written as each task/length finishes, NaN
as ``null`` with a warning, and an unwritable ``--output`` refused before the model loads."""

from __future__ import annotations

import json
import math
import os

import pytest

from megatron_endprompt.errors import UserError, run_cli
from megatron_endprompt.evaluation.core import results_io


def test_finite_or_null_reports_paths():
    found: list[str] = []
    out = results_io.finite_or_null({"a": [1.0, math.nan], "b": {"c": math.inf}, "d": "x"},
                                    found=found)
    assert out == {"a": [1.0, None], "b": {"c": None}, "d": "x"}
    assert found == ["a[1]", "b.c"]


def test_write_json_now_nan_is_null_with_one_warning(tmp_path, capsys):
    path = str(tmp_path / "r.json")
    results_io.write_json_now({"ppl": {"512": {"nll": math.nan}}}, path)
    assert json.load(open(path)) == {"ppl": {"512": {"nll": None}}}
    assert capsys.readouterr().err.count("warning:") == 1
    assert os.listdir(tmp_path) == ["r.json"]


@pytest.mark.parametrize("where", ["/sys/endprompt_eval/r.json", "DIR"])
def test_check_writable_refuses(where, tmp_path):
    if where == "DIR":
        where = str(tmp_path / "r.json")
        os.makedirs(where)
    with pytest.raises(UserError, match="--output"):
        results_io.check_writable(where)


def test_results_written_per_length_before_a_crash(fx, tmp_path, monkeypatch, capsys):
    """Perplexity at 64 then 128: a crash in the second length keeps the first on disk."""
    from megatron_endprompt.cli import eval as eval_cli
    from megatron_endprompt.evaluation.perplexity import windows as perplexity

    original, calls = perplexity.run_doc_perplexity, {"n": 0}

    def crash_second(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(*a, **k)

    monkeypatch.setattr(perplexity, "run_doc_perplexity", crash_second)
    out = str(tmp_path / "r.json")
    rc = run_cli(eval_cli.main, ["--hf-dir", fx.hf, "--tasks", "ppl", "--lengths", "64,128",
                                 "--ppl-data", fx.ppl, "--ppl-max-windows", "1", "--device",
                                 "cpu", "--output", out, "--no-progress"])
    assert rc == 130
    saved = json.load(open(out))
    assert saved["ppl"]["by_length"]["64"]["nll"] > 0
    assert "128" not in saved["ppl"]["by_length"]
