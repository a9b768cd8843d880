"""The paper's averages are printed beside a run only when the run follows the paper's protocol
for that table; otherwise ``not comparable: <every reason>``. The three runs the issue saw
printed as comparable (RULER at 1 sample on the substitute haystack, LongBench at 1 item and a
2K context, an instruct model's 11-item short-text run without its chat template) are refused
with their reasons; a run on the protocol gets the paper's numbers with their labels."""

from __future__ import annotations

import pathlib
import re

from megatron_endprompt.evaluation.longbench import run as longbench
from megatron_endprompt.evaluation.report import paper as paper_report
from megatron_endprompt.evaluation.longbench.spec import TASKS as LB_TASKS
from megatron_endprompt.evaluation.ruler.spec import ESSAY_TASKS


def _ruler_results(*, samples: int, substitute: bool) -> dict:
    tasks = {t: {"scores": {str(n): 50.0 for n in paper_report.PAPER_LENGTHS}, "ruler": True,
                 "exact_ruler": not (substitute and t in ESSAY_TASKS)}
             for t in paper_report.RULER_13}
    meta = {"lengths": list(paper_report.PAPER_LENGTHS), "samples": samples, "bench_limit": 0,
            "chat_template": "none", "tokenizer_chat_template": False}
    return {"meta": meta, "tasks": tasks}


def _longbench_results(*, length: int, limit: int, chat: str = "none",
                       has_template: bool = False) -> dict:
    lb = longbench.summarize({t: [0.4] for t in LB_TASKS})
    lb.update({"length": length, "max_prompt_tokens": length - 500})
    return {"meta": {"lengths": [length], "bench_limit": limit, "chat_template": chat,
                     "tokenizer_chat_template": has_template}, "longbench": lb}


def _short_results(*, limit: int, chat: str, has_template: bool, mmlu_shots: int = 5) -> dict:
    shots = {"mmlu": mmlu_shots, "gsm8k": 5, "hellaswag": 0, "humaneval": 0}
    benches = {b: {"score": 50.0, "metric": "m", "num_fewshot": n} for b, n in shots.items()}
    st = {"benchmarks": benches, "average": 50.0, "missing": [], "complete": True}
    return {"meta": {"lengths": [8192], "bench_limit": limit, "chat_template": chat,
                     "tokenizer_chat_template": has_template}, "short_text": st}


def test_ruler_one_sample_substitute_haystack_not_comparable():
    res = _ruler_results(samples=1, substitute=True)
    md = paper_report.paper_tables(res)
    assert "76.03" not in md and "not comparable:" in md
    reasons = paper_report.comparability(res)["ruler_4k_64k"]["reasons"]
    assert any("1 sample(s)" in r and "500" in r for r in reasons)
    assert any("substitute haystack" in r for r in reasons)
    assert len(reasons) == 2


def test_longbench_one_item_2k_not_comparable():
    res = _longbench_results(length=2048, limit=1)
    md = paper_report.paper_tables(res)
    assert "38.30" not in md and "not comparable:" in md
    reasons = paper_report.comparability(res)["longbench"]["reasons"]
    assert any("--bench-limit 1" in r for r in reasons)
    assert any("context 2048" in r for r in reasons)


def test_short_text_instruct_without_chat_template_not_comparable():
    res = _short_results(limit=11, chat="none", has_template=True)
    md = paper_report.paper_tables(res)
    assert "53.56" not in md and "not comparable:" in md
    reasons = paper_report.comparability(res)["short_text"]["reasons"]
    assert any("--bench-limit 11" in r for r in reasons)
    assert any("chat template" in r for r in reasons)
    fewer = _short_results(limit=0, chat="none", has_template=False, mmlu_shots=2)
    assert paper_report.comparability(fewer)["short_text"]["reasons"] == [
        "mmlu 2-shot (lm-eval: 5-shot)"]


def test_protocol_runs_get_the_labelled_paper_numbers():
    ruler = _ruler_results(samples=500, substitute=False)
    assert paper_report.comparability(ruler)["ruler_4k_64k"] == {"comparable": True,
                                                                 "reasons": []}
    md = paper_report.paper_tables(ruler)
    assert "EndPrompt 76.03 (abstract" in md and "PoSE 78.91 (section 4.4 / Figure 3" in md
    assert "Table 1" not in md
    lb = paper_report.paper_tables(_longbench_results(length=65536, limit=0))
    assert "EndPrompt 38.30" in lb and "not the mean of its six category means (37.99)" in lb
    assert "| average over tasks | | 40.00 |" in lb
    st = paper_report.paper_tables(_short_results(limit=0, chat="model", has_template=True))
    assert "sft_ET(PoSE) 53.56" in st and "sft_ET 52.41" in st


def test_one_arxiv_id_for_the_paper():
    """Every arXiv id the package cites for a 2026 paper (the EndPrompt paper) is the same."""
    root = pathlib.Path(paper_report.__file__).parents[2]
    ids = {m for p in root.rglob("*.py")
           for m in re.findall(r"arXiv:? ?(26\d\d\.\d{4,5})", p.read_text(encoding="utf-8"))}
    assert ids == {"2605.14589"}
