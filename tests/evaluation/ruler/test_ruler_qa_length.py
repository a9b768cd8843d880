"""qa_1/qa_2 at a length their gold paragraphs cannot fit: one ``error:`` line naming the task,
the length, the question and the fix, before the model loads (RULER's generator, and ours
before, failed mid-run on a negative ``random.sample``: "Sample larger than population or is
negative", naming neither task nor cause)."""

from __future__ import annotations

import os

import pytest

from megatron_endprompt.cli import eval as eval_cli
from megatron_endprompt.evaluation.core import runner
from tests.evaluation.tiny_tokenizers import FIXTURES


@pytest.mark.parametrize("task, gold", [("qa_2", 2), ("qa_1", 1)])
def test_gold_paragraphs_past_the_length(tiny_model_dir, tmp_path, run_tool, monkeypatch,
                                         task, gold):
    monkeypatch.setattr(runner, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    rc, _, err = run_tool(eval_cli.main, [
        "--hf-dir", tiny_model_dir, "--tasks", task, "--qa-dir",
        os.path.join(FIXTURES, "ruler_qa"), "--lengths", "1024,300", "--samples", "2",
        "--output", tmp_path / "r.json", "--no-progress"])
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: --lengths 300: {task}: length 300 is too short for "
                               f"question 0 even with only its {gold} gold paragraph(s)"), lines[0]
    assert lines[0].endswith("use a longer length") and "Sample larger" not in err
    assert not os.listdir(tmp_path)
