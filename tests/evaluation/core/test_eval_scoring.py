"""Scoring functions on hand cases: passkey exact match, RULER's string_match_all, perplexity
aggregation, and the report's summaries and markdown table."""

from __future__ import annotations

import math

import pytest

from megatron_endprompt.evaluation.report import tables as report
from megatron_endprompt.evaluation.core.scoring import (PerplexityStats, aggregate_perplexity,
                                                   mean_score, parse_first_integer,
                                                   passkey_exact, score, string_match_all)


@pytest.mark.parametrize("text, want", [
    (" 12345. Remember it.", 12345), ("The pass key is 071.", 71), ("no digits", None),
    ("", None), ("-42 and 7", 42), ("1,234", 1),
])
def test_parse_first_integer(text, want):
    assert parse_first_integer(text) == want


def test_passkey_exact():
    assert passkey_exact(" 12345.", "12345") == 1.0
    assert passkey_exact(" 12345 is the pass key", "12345") == 1.0
    assert passkey_exact(" 1234.", "12345") == 0.0
    assert passkey_exact(" 123456", "12345") == 0.0
    assert passkey_exact(" the key is 9 then 12345", "12345") == 0.0  # first integer only
    assert passkey_exact("", "12345") == 0.0


def test_string_match_all():
    refs = ["1234567", "7654321"]
    assert string_match_all(" 1234567, 7654321.", refs) == 1.0
    assert string_match_all(" 1234567 and nothing else", refs) == 0.5
    assert string_match_all("none", refs) == 0.0
    assert string_match_all("X12345678Y", ["1234567"]) == 1.0  # containment, as RULER
    assert string_match_all("Amber-Fox", ["amber-fox"]) == 1.0  # case-insensitive
    assert string_match_all("\x00 1234567\x01", ["1234567"]) == 1.0
    with pytest.raises(ValueError):
        string_match_all("x", [])


def test_score_dispatch_and_mean():
    assert score("passkey_exact", " 77", ["77"]) == 1.0
    assert score("string_match_all", "a b", ["a", "c"]) == 0.5
    with pytest.raises(ValueError, match="unknown metric"):
        score("bleu", "a", ["a"])
    assert mean_score([1.0, 0.5, 0.0]) == pytest.approx(0.5)
    assert mean_score([]) is None


def test_perplexity_aggregation():
    # token-level: windows are weighted by their token counts
    stats = aggregate_perplexity([10.0, 30.0], [10, 10])
    assert stats.mean_nll == pytest.approx(2.0)
    assert stats.ppl == pytest.approx(math.exp(2.0))
    assert stats.as_dict() == {"ppl": pytest.approx(math.exp(2.0)), "nll": 2.0, "tokens": 20,
                               "windows": 2}
    assert aggregate_perplexity([3.0, 1.0], [1, 3]).mean_nll == pytest.approx(1.0)
    big = PerplexityStats()
    big.add(nll_sum=1e6, tokens=1)
    assert math.isinf(big.ppl) and big.as_dict()["ppl"] is None
    with pytest.raises(ValueError):
        PerplexityStats().mean_nll
    with pytest.raises(ValueError):
        aggregate_perplexity([1.0], [1, 2])


def _records():
    out = []
    for length in (100, 200):
        for depth in (0.0, 1.0):
            for i, s in enumerate((1.0, 0.0) if depth == 1.0 and length == 200 else (1.0, 1.0)):
                out.append({"task": "passkey", "length": length, "depth": depth, "index": i,
                            "score": s})
            out.append({"task": "niah_single_1", "length": length, "depth": depth * 0.9,
                        "index": 0, "score": 0.5})
            out.append({"task": "niah_single_2", "length": length, "depth": depth, "index": 0,
                        "score": 0.0})
        out.append({"task": "cwe", "length": length, "depth": None, "index": 0,
                    "score": 0.25})
    return out


class _Hay:
    substitute, source = True, "builtin:shakespeare (public domain)"


def test_summary_and_markdown():
    got = report.summarize(_records(), _Hay(), [0.0, 1.0])
    summ, ruler = got["tasks"], got["ruler"]
    assert summ["passkey"]["scores"] == {"100": 100.0, "200": 75.0}  # RULER-style percent
    assert summ["passkey"]["by_depth"]["200"] == {"0": 100.0, "1": 50.0}
    assert not summ["passkey"]["ruler"] and summ["passkey"]["exact_ruler"] is False
    assert summ["niah_single_1"]["by_depth"]["100"] == {"0": 50.0, "1": 50.0}  # 0.9 -> 1
    assert summ["niah_single_1"]["exact_ruler"] and not summ["niah_single_2"]["exact_ruler"]
    assert summ["niah_single_2"]["haystack"].startswith("substitute haystack: builtin:")
    assert "by_depth" not in summ["cwe"]
    assert ruler["tasks_run"] == ["niah_single_1", "niah_single_2", "cwe"]
    assert ruler["exact_ruler_tasks"] == ["niah_single_1", "cwe"]
    assert ruler["substitute_haystack_tasks"] == ["niah_single_2"]
    assert ruler["average"] == {"100": 25.0, "200": 25.0}  # (50 + 0 + 25) / 3
    results = {"meta": {"hf_dir": "m", "lengths": [100, 200], "depths": [0.0, 1.0],
                        "samples": 2, "seed": 0, "dtype": "float32", "device": "cpu",
                        "max_position_embeddings": 128},
               **got,
               "ppl": {"stride": 8, "by_length": {"100": {"ppl": 12.345, "nll": 2.5,
                                                          "tokens": 1, "windows": 1},
                                                  "200": {"ppl": float("inf")}}}}
    md = report.markdown_table(results).splitlines()
    assert md[0] == "| task | 100 | 200 |"
    assert "| passkey | 100.0 | 75.0 |" in md
    assert "| niah_single_1 (RULER) | 50.0 | 50.0 |" in md
    assert "| niah_single_2 (RULER, substitute haystack) | 0.0 | 0.0 |" in md
    assert "| RULER average (3 tasks) | 25.0 | 25.0 |" in md
    assert "| ppl | 12.35 | inf |" in md or "| ppl | 12.35 | n/a |" in md
    assert report.finite(results)["ppl"]["by_length"]["200"]["ppl"] is None
    assert report.finite({"a": [float("nan"), 1.0, (float("-inf"),)]}) == {"a": [None, 1.0,
                                                                               [None]]}
    assert report.output_paths("/x/res.json") == {
        "json": "/x/res.json", "md": "/x/res.md", "niah_png": "/x/res_niah.png",
        "ppl_png": "/x/res_ppl.png"}


def test_string_match_part_as_ruler():
    """RULER: part = any reference contained (max), all = fraction contained (mean)."""
    from megatron_endprompt.evaluation.core.scoring import string_match_part
    refs = ["Paris", "the capital"]
    assert string_match_part(" paris, France", refs) == 1.0
    assert string_match_part(" Lyon", refs) == 0.0
    assert string_match_all(" paris, France", refs) == 0.5
    assert string_match_part("\n\t Paris\x00 ", ["paris"]) == 1.0


def test_ppl_report_states_documents_and_tokens_not_samples():
    """A perplexity-only run uses no prompt samples (``--samples`` defaults to 5 all the
    same): the report names the documents and scored tokens PPL used at each length."""
    results = {"meta": {"hf_dir": "m", "lengths": [100, 200], "samples": 5, "seed": 0,
                        "dtype": "float32", "device": "cpu", "max_position_embeddings": 128},
               "tasks": {},
               "ppl": {"stride": 8, "by_length": {
                   "100": {"ppl": 9.0, "nll": 2.2, "tokens": 396, "windows": 12, "docs": 3,
                           "docs_skipped": 1},
                   "200": {"ppl": None, "nll": None, "tokens": 0, "windows": 0, "docs": 0,
                           "docs_skipped": 4}}}}
    md = report.markdown_table(results)
    assert "sample(s)" not in md
    assert "100: 3 document(s) (1 shorter skipped), 396 scored token(s) in 12 window(s)" in md
    assert "200: 0 document(s) (4 shorter skipped), 0 scored token(s)" in md
    # with prompt tasks too, the sample count stays (it is theirs) beside the PPL counts
    results["tasks"] = report.summarize(_records(), _Hay(), [0.0, 1.0])["tasks"]
    md = report.markdown_table(results)
    assert "5 sample(s) per task x length" in md and "3 document(s)" in md
