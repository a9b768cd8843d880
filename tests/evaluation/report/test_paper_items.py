"""The comparability gate counts items: a LongBench data folder of 2 items per task and
short-text files of 2-4 items, from a random model, were printed "comparable with this run"
beside the paper's 38.30 and 53.56 / 52.41; RULER cells with fewer than RULER's 500 items
likewise. Every paper table states its items per task (x length), and the JSON blocks carry
them."""

from __future__ import annotations

from megatron_endprompt.evaluation.longbench import run as longbench
from megatron_endprompt.evaluation.longbench.spec import TASKS as LB_TASKS
from megatron_endprompt.evaluation.report import paper as paper_report
from megatron_endprompt.evaluation.report import tables as report

#: THUDM/LongBench's test splits (the dataset viewer's row counts), English tasks.
LB_SIZES = {**dict.fromkeys(LB_TASKS, 200), "multifieldqa_en": 150, "lcc": 500,
            "repobench-p": 500}
SHOTS = {"mmlu": 5, "gsm8k": 5, "hellaswag": 0, "humaneval": 0}
FULL = {"mmlu": 14_042, "gsm8k": 1_319, "hellaswag": 10_042, "humaneval": 164}


def _longbench(items: dict[str, int]) -> dict:
    lb = longbench.summarize({t: [0.4] for t in LB_TASKS})
    lb.update({"length": 65536, "max_prompt_tokens": 65036, "items": items})
    return {"meta": {"lengths": [65536], "bench_limit": 0, "chat_template": "none",
                     "tokenizer_chat_template": False}, "longbench": lb}


def _short(items: dict[str, int]) -> dict:
    benches = {b: {"score": 50.0, "metric": "m", "num_fewshot": n, "items": items[b]}
               for b, n in SHOTS.items()}
    return {"meta": {"lengths": [8192], "bench_limit": 0, "chat_template": "none",
                     "tokenizer_chat_template": False},
            "short_text": {"benchmarks": benches, "average": 50.0, "missing": [],
                           "complete": True}}


def _ruler(items: int) -> dict:
    tasks = {t: {"scores": {str(n): 50.0 for n in paper_report.PAPER_LENGTHS}, "ruler": True,
                 "exact_ruler": True,
                 "items": {str(n): items for n in paper_report.PAPER_LENGTHS}}
             for t in paper_report.RULER_13}
    return {"meta": {"lengths": list(paper_report.PAPER_LENGTHS), "samples": 500,
                     "bench_limit": 0, "chat_template": "none",
                     "tokenizer_chat_template": False}, "tasks": tasks}


def test_longbench_two_items_per_task_not_comparable():
    res = _longbench(dict.fromkeys(LB_TASKS, 2))
    reasons = paper_report.comparability(res)["longbench"]["reasons"]
    short = ", ".join(f"{t} 2 of {LB_SIZES[t]}" for t in LB_TASKS)
    assert reasons == [f"fewer items than LongBench's ({short}): a truncated data file or "
                       "--bench-limit"]
    md = paper_report.paper_tables(res)
    assert "comparable with this run" not in md and "38.30" not in md
    assert "| single_doc_qa | narrativeqa 40.00 (2), qasper 40.00 (2)" in md
    full = _longbench(dict(LB_SIZES))
    assert paper_report.comparability(full)["longbench"] == {"comparable": True, "reasons": []}
    assert "narrativeqa 40.00 (200)" in paper_report.paper_tables(full)


def test_short_text_few_items_not_comparable():
    res = _short({"mmlu": 4, "gsm8k": 2, "hellaswag": 3, "humaneval": 2})
    reasons = paper_report.comparability(res)["short_text"]["reasons"]
    assert reasons == ["fewer items than the benchmarks' (mmlu 4 of 14042, gsm8k 2 of 1319, "
                       "hellaswag 3 of 10042, humaneval 2 of 164): a truncated data file or "
                       "--bench-limit"]
    md = paper_report.paper_tables(res)
    assert "53.56" not in md and "| gsm8k | m | 5 | 2 | 50.00 |" in md
    assert paper_report.comparability(_short(FULL))["short_text"]["comparable"]


def test_ruler_cells_short_of_500_items():
    assert paper_report.comparability(_ruler(500))["ruler_4k_64k"]["comparable"]
    assert "Items: 500 per task x length." in paper_report.paper_tables(_ruler(500))
    reasons = paper_report.comparability(_ruler(499))["ruler_4k_64k"]["reasons"]
    assert len(reasons) == 1 and reasons[0].startswith(
        "fewer than RULER's 500 items in niah_single_1@4096 499")


def test_sizes_are_the_benchmarks():
    from megatron_endprompt.evaluation.longbench.spec import E_SIZES, E_TASKS, SIZES
    from megatron_endprompt.evaluation.short_text.spec import SIZES as SHORT

    assert SIZES == LB_SIZES and SHORT == FULL
    assert sum(E_SIZES[t] for t in E_TASKS) == 3_668  # the 13 ``_e`` configs' rows


def test_native_summary_records_items_per_length():
    recs = [{"task": "passkey", "length": n, "index": i, "depth": None, "score": 1.0,
             "prompt_tokens": 10} for n, k in ((256, 3), (512, 2)) for i in range(k)]
    got = report.summarize(recs, None, [])
    assert got["tasks"]["passkey"]["items"] == {"256": 3, "512": 2}
    assert report.items_note(got["tasks"]) == "items per task x length: passkey@256 3, " \
        "passkey@512 2"
