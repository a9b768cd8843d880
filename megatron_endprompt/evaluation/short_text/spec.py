"""The short-text retention benchmarks: their names (the tables' order) and the items of each
one's evaluation split, which a run must cover to stand beside a published number."""

from __future__ import annotations

__all__ = ["BENCHMARKS", "SIZES"]

BENCHMARKS = ("mmlu", "gsm8k", "hellaswag", "humaneval")
#: Items of each benchmark's evaluation split (MMLU test, GSM8K test, HellaSwag validation,
#: HumanEval): a run over fewer is not comparable with a published number.
SIZES = {"mmlu": 14_042, "gsm8k": 1_319, "hellaswag": 10_042, "humaneval": 164}
