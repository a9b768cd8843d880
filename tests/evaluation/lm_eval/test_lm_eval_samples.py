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
        assert rec["exact_match"] in (0.0, 1.0)
    summary = json.loads((tmp_path / "r.json").read_text())
    mean = sum(r["exact_match"] for r in lines) / 3
    assert abs(summary["tasks"]["tiny_qa"]["metrics"]["exact_match"]["value"] - mean) < 1e-9
