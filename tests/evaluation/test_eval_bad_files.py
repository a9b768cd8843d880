"""Bad evaluation inputs are one ``error:`` line (exit 2) before the model loads and before any
output is written: a LongBench file that is not UTF-8, a malformed ``mmlu_test.jsonl`` under
``--short-text-dir`` (lm-eval's ``datasets`` loader gave a traceback), and ``--lengths`` far past
the model's window (it ran unbounded)."""

from __future__ import annotations

import json
import os

import pytest

from megatron_endprompt.cli import eval as eval_cli
from megatron_endprompt.evaluation.core import runner

GOOD_MMLU = {"question": "q?", "subject": "s", "choices": ["a", "b", "c", "d"], "answer": 1}


@pytest.fixture
def no_model(monkeypatch):
    monkeypatch.setattr(runner, "load_model", lambda *a, **k: pytest.fail("model loaded"))


def _one_error(rc, err, *needles):
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


def test_longbench_file_not_utf8(tiny_model_dir, tmp_path, run_tool, no_model):
    lb = tmp_path / "lb"
    lb.mkdir()
    item = {"input": "q", "context": "c", "answers": ["a"], "all_classes": None}
    (lb / "hotpotqa.jsonl").write_bytes(json.dumps(item).encode() + b"\n"
                                        + json.dumps(item).encode()[:-2] + b"\xff\xfe\"}\n")
    rc, _, err = run_tool(eval_cli.main, [
        "--hf-dir", tiny_model_dir, "--tasks", "none", "--lengths", "1024",
        "--longbench-dir", lb, "--output", tmp_path / "r.json", "--no-progress"])
    _one_error(rc, err, "--longbench-dir", "hotpotqa.jsonl line 2", "UTF-8")
    assert not os.path.exists(tmp_path / "r.json")


@pytest.mark.parametrize("line, needle", [
    ("{not json", "line 2 is not JSON"),
    (json.dumps({"question": "q", "subject": "s", "choices": ["a", "b"], "answer": 0}),
     "choices (a list of 4)"),
    (json.dumps({"question": "q", "choices": ["a", "b", "c", "d"], "answer": 0}),
     "lacks MMLU field(s) subject"),
    (json.dumps({**GOOD_MMLU, "answer": "B"}), "answer (an integer 0-3)"),
])
def test_malformed_mmlu_file(tiny_model_dir, tmp_path, run_tool, no_model, line, needle):
    st = tmp_path / "st"
    st.mkdir()
    (st / "mmlu_test.jsonl").write_text(json.dumps(GOOD_MMLU) + "\n" + line + "\n")
    rc, _, err = run_tool(eval_cli.main, [
        "--hf-dir", tiny_model_dir, "--tasks", "none", "--lengths", "1024",
        "--short-text-dir", st, "--output", tmp_path / "r.json", "--no-progress"])
    _one_error(rc, err, "--short-text-dir", "mmlu_test.jsonl line 2", needle)
    assert not os.path.exists(tmp_path / "r.json")


def test_length_far_past_the_window(tiny_model_dir, tmp_path, run_tool, no_model):
    """The tiny model's window is 256 tokens: 16x is the cap, 1,000,000 is refused (past
    ``MAX_LENGTH`` every model refuses it before its config is read)."""
    cap = 16 * 256  # suite.MAX_LENGTH_FACTOR x max_position_embeddings
    rc, _, err = run_tool(eval_cli.main, [
        "--hf-dir", tiny_model_dir, "--tasks", "niah_single_1", "--lengths",
        f"1024,{cap + 1},1000000", "--output", tmp_path / "r.json", "--no-progress"])
    _one_error(rc, err, f"--lengths {cap + 1},1000000", "max_position_embeddings (256",
               f"at most {cap}")
    assert not os.path.exists(tmp_path / "r.json")
