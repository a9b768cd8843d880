"""LongBench at several contexts in one run (``--longbench-lengths``) and LongBench-E
(``--longbench-e``: ``{task}_e.jsonl``, scores per length bucket as LongBench ``eval.py``'s
``scorer_e``: < 4000, < 8000, else, by the item's ``length`` field)."""

from __future__ import annotations

import json
import os

from megatron_endprompt.cli import eval as eval_cli
from megatron_endprompt.evaluation.longbench import run as longbench
from tests.evaluation.tiny_tokenizers import FIXTURES

FIX = os.path.join(FIXTURES, "longbench")


def test_buckets_as_scorer_e():
    recs = [{"length": 100, "score": 1.0}, {"length": 3999, "score": 0.0},
            {"length": 4000, "score": 0.5}, {"length": 12000, "score": 0.25}]
    assert longbench.by_length_bucket(recs) == {"0-4k": 50.0, "4-8k": 50.0, "8k+": 25.0}
    assert longbench.by_length_bucket(recs[:1]) == {"0-4k": 100.0, "4-8k": None, "8k+": None}


def test_e_and_several_contexts_in_one_run(tiny_model_dir, tmp_path, run_tool):
    lb = tmp_path / "lb"
    lb.mkdir()
    with open(os.path.join(FIX, "trec.jsonl"), encoding="utf-8") as f:
        item = json.loads(f.readline())
    items = [{**item, "length": n} for n in (1200, 5000)]
    (lb / "trec_e.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    out = tmp_path / "r.json"
    rc, _, err = run_tool(eval_cli.main, [
        "--hf-dir", tiny_model_dir, "--tasks", "none", "--lengths", "1024",
        "--longbench-dir", lb, "--longbench-e", "--longbench-lengths", "600,1024",
        "--output", out, "--no-progress"])
    assert rc == 0, err
    res = json.loads(out.read_text())
    assert set(res["longbench_by_length"]) == {"600", "1024"}
    lb_res = res["longbench"]
    assert lb_res["length"] == 1024 and lb_res["e"] is True
    recs = lb_res["samples"]["trec"]
    assert [r["length"] for r in recs] == [1200, 5000]
    assert lb_res["buckets"]["trec"] == {"0-4k": round(100 * recs[0]["score"], 2),
                                         "4-8k": round(100 * recs[1]["score"], 2),
                                         "8k+": None}
    assert "qasper" in lb_res["missing"] and "narrativeqa" not in lb_res["missing"]
    assert "LongBench-E (--longbench-e), not LongBench" in \
        res["paper_comparable"]["longbench"]["reasons"]
