"""Labels a table can be quoted by: an average names the lengths and tasks it covers (a 2K+4K
run printed "4K-64K average (ours)" from 4K alone); the LongBench paper line says which of our
two averages 38.30 is read beside; lm-eval's fractions are on the 0-100 scale of every other
table; ``--help`` names every benchmark."""

from __future__ import annotations

from megatron_endprompt.cli import eval as eval_cli
from megatron_endprompt.evaluation.longbench import run as longbench
from megatron_endprompt.evaluation.longbench.spec import TASKS as LB_TASKS
from megatron_endprompt.evaluation.report import paper as paper_report
from megatron_endprompt.evaluation.report import tables as report


def _ruler(lengths: list[int]) -> dict:
    tasks = {t: {"scores": {str(n): 50.0 for n in lengths}, "ruler": True, "exact_ruler": True}
             for t in paper_report.RULER_13}
    return {"meta": {"lengths": lengths, "samples": 500, "bench_limit": 0,
                     "chat_template": "none", "tokenizer_chat_template": False},
            "tasks": tasks}


def test_ruler_average_names_its_lengths_and_tasks():
    md = paper_report.paper_tables(_ruler([2048, 4096]))
    assert "4K-64K average (ours)" not in md and "4K-64K average over" not in md
    assert "4K average over 13 task(s) (ours): 50.00" in md
    full = paper_report.paper_tables(_ruler(list(paper_report.PAPER_LENGTHS)))
    assert "4K-64K average over 13 task(s) (ours): 50.00" in full
    avg = paper_report.ruler_paper_average(_ruler([2048, 4096])["tasks"])
    assert avg["lengths_averaged"] == [4096] and len(avg["tasks_averaged"]) == 13


def test_longbench_paper_line_names_its_average():
    lb = longbench.summarize({t: [0.4] for t in LB_TASKS})
    lb.update({"length": 65536, "max_prompt_tokens": 65036})
    md = paper_report.paper_tables({"meta": {"lengths": [65536], "bench_limit": 0,
                                             "chat_template": "none",
                                             "tokenizer_chat_template": False},
                                    "longbench": lb})
    assert "EndPrompt 38.30" in md and "read it beside our average over tasks" in md


def test_lm_eval_fractions_on_the_0_100_scale():
    results = {"tasks": {"t": {"metrics": {
        "acc": {"value": 0.5, "stderr": 0.05, "filter": "none"},
        "word_perplexity": {"value": 12.5, "stderr": None, "filter": "none"}}, "scores": {}}}}
    md = report.metrics_markdown(results)
    assert "| t | acc (0-100) | 50 | 5 |" in md
    assert "| t | word_perplexity | 12.5 | n/a |" in md


def test_help_names_every_benchmark():
    text = eval_cli.build_parser().format_help()
    for name in ("RULER", "qa_1", "passkey", "perplexity", "LongBench", "LongBench-E", "MMLU",
                 "GSM8K", "HellaSwag", "HumanEval", "lm-evaluation-harness", "0-100"):
        assert name in text, name
