"""``--save-prompts`` with ``--backend lm-eval`` keeps lm-eval's per-sample log (its
``log_samples``): for every document the prompt the model got, the target, the output and the
metric, so a 0 from empty outputs can be told from wrong answers (the flag was refused)."""

from __future__ import annotations

import json

from megatron_endprompt.cli import eval as eval_cli
from test_eval_lm_eval import QA, _task_dir


def test_per_sample_outputs_saved(tiny_model_dir, tmp_path, run_tool):
    tasks = _task_dir(tmp_path / "tasks", "tiny_qa")
    saved = tmp_path / "samples.jsonl"
    rc, _, err = run_tool(eval_cli.main, [
        "--hf-dir", tiny_model_dir, "--backend", "lm-eval", "--lm-eval-include", tasks,
        "--tasks", "tiny_qa", "--lengths", "512", "--device", "cpu",
        "--save-prompts", saved, "--output", tmp_path / "r.json", "--no-progress"])
    assert rc == 0, err
    lines = [json.loads(x) for x in saved.read_text().splitlines()]
    assert sorted(r["doc_id"] for r in lines) == [0, 1, 2]
    for rec in lines:
        qa = QA[rec["doc_id"]]
        assert rec["task"] == "tiny_qa"
        assert rec["prompt"] == f"Question: {qa['question']}\nAnswer:"
        assert rec["target"] == qa["answer"]
        assert isinstance(rec["output"], list) and isinstance(rec["output"][0], str)
        assert isinstance(rec["raw_output"], list)  # lm-eval's resps, before the filters
        assert rec["exact_match"] in (0.0, 1.0)
    summary = json.loads((tmp_path / "r.json").read_text())
    mean = sum(r["exact_match"] for r in lines) / 3
    assert abs(summary["tasks"]["tiny_qa"]["metrics"]["exact_match"]["value"] - mean) < 1e-9


def test_raw_response_kept_beside_the_filtered_one():
    """An empty generation and a wrong-format one both filter to ``[invalid]``; the record
    keeps lm-eval's raw ``resps`` so they can be told apart."""
    from megatron_endprompt.evaluation.lm_eval.results import sample_records

    out = {"samples": {"gsm8k": [
        {"doc_id": i, "arguments": [["Q: 1+1?\nA:", {"until": ["Q:"]}]], "target": "2",
         "resps": [[raw]], "filtered_resps": ["[invalid]"], "filter": "strict-match",
         "metrics": ["exact_match"], "exact_match": 0.0}
        for i, raw in enumerate(["", "The answer is two."])]}}
    recs = sample_records(out)
    assert [r["output"] for r in recs] == [["[invalid]"], ["[invalid]"]]
    assert [r["raw_output"] for r in recs] == [[[""]], [["The answer is two."]]]
