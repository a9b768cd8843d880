"""LongBench's tasks as facts: prompt templates, generation budgets, categories.

Templates and budgets are LongBench's ``config/dataset2prompt.json`` and
``config/dataset2maxlen.json`` (github.com/THUDM/LongBench commit 2e00731), stored verbatim in
``assets/longbench_config.json``. The six categories are LongBench's own grouping (its
README's task table), which the EndPrompt paper reports: single-doc QA, multi-doc QA,
summarisation, few-shot, synthetic, code.

Only the English tasks are offered: the Chinese ones (multifieldqa_zh, dureader, vcsum, lsht,
passage_retrieval_zh) are scored by LongBench with jieba word segmentation (``qa_f1_zh_score``,
``rouge_zh_score``), a dependency we do not carry; the scores here are LongBench's English
(``LongBench-en``) subset.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache

__all__ = ["CATEGORIES", "TASKS", "CHINESE_TASKS", "prompt_template", "max_new_tokens",
           "NO_CHAT_TASKS", "TRUNCATION_MARGIN", "E_TASKS", "E_BUCKETS", "SIZES", "E_SIZES"]

#: the package's ``evaluation/assets/`` (setup.py ships it as package data)
_ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")
_CONFIG = os.path.join(_ASSETS, "longbench_config.json")

#: LongBench's categories (English tasks), in its order.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "single_doc_qa": ("narrativeqa", "qasper", "multifieldqa_en"),
    "multi_doc_qa": ("hotpotqa", "2wikimqa", "musique"),
    "summarization": ("gov_report", "qmsum", "multi_news"),
    "few_shot": ("trec", "triviaqa", "samsum"),
    "synthetic": ("passage_count", "passage_retrieval_en"),
    "code": ("lcc", "repobench-p"),
}
TASKS: tuple[str, ...] = tuple(t for ts in CATEGORIES.values() for t in ts)
CHINESE_TASKS = ("multifieldqa_zh", "dureader", "vcsum", "lsht", "passage_retrieval_zh")
#: LongBench ``pred.py``: tasks that never get a chat template, even for chat models
#: (``chat``; base models get none for any task).
NO_CHAT_TASKS = ("trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p")
#: LongBench-E (``pred.py --e``): its English tasks, read from ``{task}_e.jsonl``.
E_TASKS: tuple[str, ...] = ("qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "gov_report",
                            "multi_news", "trec", "triviaqa", "samsum", "passage_count",
                            "passage_retrieval_en", "lcc", "repobench-p")
#: Items per English task in LongBench's ``data/`` (THUDM/LongBench's test splits): what the
#: paper's average is over; a run over fewer items is not comparable with it.
SIZES: dict[str, int] = {**dict.fromkeys(TASKS, 200), "multifieldqa_en": 150, "lcc": 500,
                         "repobench-p": 500}
#: Items per LongBench-E task (``{task}_e``).
E_SIZES: dict[str, int] = {**dict.fromkeys(E_TASKS, 300), "multifieldqa_en": 150,
                           "multi_news": 294, "qasper": 224}
#: LongBench ``eval.py`` ``scorer_e``: buckets by the item's ``length`` field (< 4000, < 8000,
#: else).
E_BUCKETS: tuple[tuple[str, float], ...] = (("0-4k", 4000), ("4-8k", 8000),
                                            ("8k+", float("inf")))
#: LongBench's ``model2maxlen`` leaves 500 tokens of a model's context for generation
#: (4K -> 3500, 8K -> 7500, 16K -> 15500, 32K -> 31500); prompts are cut to ``length - 500``.
TRUNCATION_MARGIN = 500


@lru_cache(maxsize=1)
def _config() -> dict:
    with open(_CONFIG, encoding="utf-8") as f:
        return json.load(f)


def prompt_template(task: str) -> str:
    """LongBench's ``dataset2prompt[task]`` (``{context}`` and ``{input}`` fields)."""
    return _config()["dataset2prompt"][task]


def max_new_tokens(task: str) -> int:
    """LongBench's ``dataset2maxlen[task]``: the generation budget in tokens."""
    return int(_config()["dataset2maxlen"][task])
