"""LongBench, RULER qa_1/qa_2, short-text retention and the paper-layout report on the
made-up fixtures in ``fixtures/`` (LongBench's JSONL, RULER's SQuAD/HotpotQA JSON, lm-eval's
MMLU/GSM8K/HellaSwag JSONL, HumanEval JSONL), offline, on the random tiny Llama; each item
scored by its benchmark's metric."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from megatron_endprompt.cli import eval as eval_cli
from megatron_endprompt.evaluation.short_text import humaneval
from megatron_endprompt.evaluation.longbench import run as longbench
from megatron_endprompt.evaluation.report import paper as paper_report
from megatron_endprompt.evaluation.ruler import qa as ruler_qa
from megatron_endprompt.evaluation.core import runner
from megatron_endprompt.evaluation.longbench.metrics import score_prediction
from megatron_endprompt.evaluation.core.prompt import TextTokens
from megatron_endprompt.evaluation.core.scoring import string_match_part
from tests.evaluation.tiny_tokenizers import FIXTURES

FIX = FIXTURES


@pytest.fixture(scope="module")
def model_tok(tiny_model_dir):
    return (runner.load_model(tiny_model_dir, device="cpu", dtype="float32"),
            runner.load_tokenizer(tiny_model_dir))


def test_longbench_middle_truncation(tiny_model_dir):
    tok = runner.load_tokenizer(tiny_model_dir)
    short = longbench.build_prompt("hotpotqa", {"context": "x", "input": "q"}, tok, 10**6)
    assert tok.decode(short, skip_special_tokens=True) == \
        "Answer the question based on the given passages. Only give me the answer and do not " \
        "output any other words.\n\nThe following are given passages.\nx\n\nAnswer the " \
        "question based on the given passages. Only give me the answer and do not output any " \
        "other words.\n\nQuestion: q\nAnswer:"
    item = {"context": "word " * 400, "input": "Who kept the log?"}
    limit = len(short) + 40
    full = longbench.build_prompt("hotpotqa", item, tok, 10**6)
    ids = longbench.build_prompt("hotpotqa", item, tok, max_length=limit)
    text = tok.decode(ids, skip_special_tokens=True)
    assert len(full) > 2 * limit and limit - 4 <= len(ids) <= limit + 2  # halves re-tokenized
    assert text.startswith("Answer the question based on the given passages.")
    assert text.endswith("Question: Who kept the log?\nAnswer:")
    assert text.count("word") < 40


def test_longbench_runs_fixture(model_tok, tmp_path):
    model, tok = model_tok
    for t in ("qasper", "trec", "passage_count", "lcc"):  # 4 categories of 6
        shutil.copy(os.path.join(FIX, "longbench", f"{t}.jsonl"), tmp_path)
    res = longbench.run_longbench(model, tok, str(tmp_path), length=600)
    assert list(res["tasks"]) == ["qasper", "trec", "passage_count", "lcc"]
    for task, recs in res["samples"].items():
        items = longbench.load_task(str(tmp_path), task)
        for r, it in zip(recs, items, strict=True):
            assert r["prompt_tokens"] <= 100
            assert r["score"] == score_prediction(task, r["output"], it["answers"],
                                                  it["all_classes"])
        assert res["tasks"][task] == round(100 * sum(r["score"] for r in recs) / len(recs), 2)
    assert res["categories"]["summarization"] is None and not res["complete"]
    cats = [v for v in res["categories"].values() if v is not None]
    assert len(cats) == 4 and res["average"] == pytest.approx(sum(cats) / 4, abs=0.01)
    assert "gov_report" in res["missing"]


def test_longbench_summary_by_category():
    scores = {"qasper": [1.0, 0.0], "narrativeqa": [1.0], "trec": [0.25]}
    s = longbench.summarize(scores)
    assert s["tasks"] == {"qasper": 50.0, "narrativeqa": 100.0, "trec": 25.0}
    assert s["categories"]["single_doc_qa"] == 75.0 and s["categories"]["few_shot"] == 25.0
    assert s["average"] == 50.0 and s["categories"]["code"] is None


def test_ruler_qa_prompts(tiny_model_dir):
    tokens = TextTokens(runner.load_tokenizer(tiny_model_dir))
    qa_dir = os.path.join(FIX, "ruler_qa")
    qas, docs = ruler_qa.load_qa(qa_dir, "qa_1")
    assert [q["query"] for q in qas] == ["Who kept the log?", "When did the museum open?",
                                         "When does the harbour freeze?"]  # impossible dropped
    assert len(docs) == 3 and qas[0]["more_context"]
    for task, answer in (("qa_1", "Mara Quill"), ("qa_2", "the town museum")):
        samples = ruler_qa.make_qa_samples(task, tokens, qa_dir=qa_dir, length=1024,
                                           samples=2, seed=42)
        s = samples[0]
        assert s.prompt.startswith("Answer the question based on the given documents.")
        assert s.prompt.endswith("Question: " + (qas[0]["query"] if task == "qa_1" else
                                                 "Which museum holds the log of the keeper of "
                                                 "the red lighthouse?") + " Answer:")
        assert "Document 1:\n" in s.prompt and len(s.input_ids) + 32 <= 1024
        assert s.metric == "string_match_part" and answer in s.answers
        assert string_match_part(f" {answer.upper()}.", s.answers) == 1.0
    with pytest.raises(ValueError, match="too short"):
        ruler_qa.make_qa_samples("qa_1", tokens, qa_dir=qa_dir, length=80, samples=1, seed=42)


def test_humaneval_sandbox():
    prob = json.loads(open(os.path.join(FIX, "short_text", "humaneval.jsonl")).readline())
    assert humaneval.run_program(humaneval.program(prob, prob["canonical_solution"]))["passed"]
    bad = humaneval.run_program(humaneval.program(prob, "    return a - b\n"))
    assert not bad["passed"] and "AssertionError" in bad["result"]
    slow = humaneval.run_program("while True:\n    pass\n", timeout=1.5)
    assert slow == {"passed": False, "result": "timed out"}
    env = humaneval.run_program("import os, sys\nassert not os.listdir('.')\n"
                                "assert 'HOME' not in os.environ\nassert sys.flags.isolated\n")
    assert env["passed"], env
    assert humaneval.truncate_completion("    return 1\ndef other():\n") == "    return 1"


@pytest.mark.slow
def test_short_text_through_lm_eval(model_tok):
    from megatron_endprompt.evaluation.short_text.run import run_short_text

    model, tok = model_tok
    res = run_short_text(model, tok, os.path.join(FIX, "short_text"), length=512, limit=2)
    assert list(res["benchmarks"]) == ["mmlu", "gsm8k", "hellaswag", "humaneval"]
    b = res["benchmarks"]
    assert b["mmlu"]["num_fewshot"] == 2 and b["gsm8k"]["num_fewshot"] == 1
    # lm-eval's per-sample log (for --save-prompts): MMLU prompts carry the subject line
    mmlu = [r for r in res["lm_eval_samples"] if r["task"].startswith("endprompt_mmlu")]
    assert len(mmlu) == 2 and all(r["prompt"].startswith(
        "The following are multiple choice questions (with answers) about made up.\n\n")
        for r in mmlu)
    assert all(r["continuations"] == [" A", " B", " C", " D"] for r in mmlu)
    for name, key in (("mmlu", "acc,none"), ("gsm8k", "exact_match,strict-match"),
                      ("hellaswag", "acc_norm,none")):
        assert b[name]["lm_eval_metrics"]["sample_len"] == 2  # lm-eval read the local file
        assert b[name]["score"] == round(100 * b[name]["lm_eval_metrics"][key], 2)
    he = b["humaneval"]
    assert he["problems"] == 2 and he["score"] == 100 * he["passed"] / 2
    assert res["average"] == pytest.approx(sum(x["score"] for x in b.values()) / 4, abs=0.01)
    assert res["lm_eval_seeds"] == {"random_seed": 0, "numpy_random_seed": 1234,
                                    "torch_random_seed": 1234, "fewshot_random_seed": 1234}
    assert he["timeout_s"] == 3.0
    assert all("raw_output" in r for r in res["lm_eval_samples"])


def test_paper_average_as_ruler():
    tasks = {t: {"scores": {str(n): float(i) for n in paper_report.PAPER_LENGTHS}}
             for i, t in enumerate(paper_report.RULER_13)}
    tasks["qa_2"]["scores"]["65536"] = None
    avg = paper_report.ruler_paper_average(tasks)
    assert avg["per_length"]["4096"] == 6.0 and avg["per_length"]["65536"] == 5.5
    assert avg["average_4k_64k"] == round((6.0 * 4 + 5.5) / 5, 2)
    assert not avg["missing_tasks"] and not avg["missing_lengths"]
    del tasks["qa_1"]
    assert paper_report.ruler_paper_average(tasks)["missing_tasks"] == ["qa_1"]


def test_cli_benchmarks_and_report(tiny_model_dir, tmp_path, run_tool):
    lb = tmp_path / "lb"
    lb.mkdir()
    shutil.copy(os.path.join(FIX, "longbench", "passage_retrieval_en.jsonl"), lb)
    out = tmp_path / "res.json"
    rc, stdout, err = run_tool(eval_cli.main, [
        "--hf-dir", tiny_model_dir, "--tasks", "qa_1,qa_2", "--lengths", "600",
        "--samples", "1", "--qa-dir", os.path.join(FIX, "ruler_qa"), "--longbench-dir", lb,
        "--device", "cpu", "--output", out, "--no-progress"])
    assert rc == 0, err
    res = json.loads(out.read_text())
    assert set(res["tasks"]) == {"qa_1", "qa_2"} and res["tasks"]["qa_1"]["exact_ruler"]
    assert res["longbench"]["tasks"].keys() == {"passage_retrieval_en"}
    md = (tmp_path / "res.md").read_text()
    assert "### LongBench" in md and "| synthetic | passage_retrieval_en" in md
    assert "Paper's 4K-64K averages: not comparable: missing tasks niah_single_1" in md
    assert "Paper's LongBench average: not comparable: missing tasks" in md
    assert "38.30" not in md  # 1 task of 16: no paper number beside it
    assert not res["paper_comparable"]["longbench"]["comparable"]


def test_cli_errors(tiny_model_dir, tmp_path, run_tool):
    base = ["--hf-dir", tiny_model_dir, "--lengths", "600", "--output", tmp_path / "r.json"]
    empty = tmp_path / "empty"  # a data folder apart from the output (one inside is refused)
    empty.mkdir()
    rc, _, err = run_tool(eval_cli.main, [*base, "--tasks", "qa_1"])
    assert rc == 2 and "--qa-dir" in err and "Traceback" not in err
    rc, _, err = run_tool(eval_cli.main, [*base, "--tasks", "none", "--longbench-dir", empty])
    assert rc == 2 and "no LongBench file" in err
    rc, _, err = run_tool(eval_cli.main, [*base, "--tasks", "qa_2", "--qa-dir", empty])
    assert rc == 2 and "hotpotqa.json" in err
    assert not (tmp_path / "r.json").exists()
