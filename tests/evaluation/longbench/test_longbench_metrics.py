"""LongBench's metrics (``longbench_metrics``) against hand-computed values, including the
quirks carried from LongBench: summary-level (union) ROUGE-L of the ``rouge`` package, the
list-removal skip of ``classification_score``, the first-line rule of trec/triviaqa/samsum."""

from __future__ import annotations

import pytest

from megatron_endprompt.evaluation.longbench import metrics as m
from megatron_endprompt.evaluation.longbench import spec


def test_normalize_and_qa_f1():
    assert m.normalize_answer("The  Mara, Quill!") == "mara quill"
    assert m.qa_f1_score("The Mara Quill.", "Mara Quill") == 1.0
    # 2 common of 3 predicted / 2 true: P = 2/3, R = 1, F1 = 0.8
    assert m.qa_f1_score("Mara and Quill", "Mara Quill") == pytest.approx(0.8)
    assert m.qa_f1_score("nothing", "Mara Quill") == 0.0


def test_rouge_l_single_sentence():
    # LCS "the cat on the mat" -> distinct words {the, cat, on, mat} = 4; 5 distinct each side
    assert m.rouge_l("the cat sat on the mat", "the cat is on the mat") == pytest.approx(0.8)


def test_rouge_l_is_summary_level_union():
    # per reference sentence the union of its LCS with every predicted sentence: all 4 words;
    # a single-sequence LCS of "a b c d" / "a c b d" would give 3/4
    assert m.rouge_l("a b. c d", "a c. b d") == pytest.approx(1.0, abs=1e-7)
    assert m.rouge_score("", "a b") == 0.0 and m.rouge_score("...", "a b") == 0.0


def test_classification_keeps_longbench_removal_skip():
    classes = ["Location", "Other location", "Individual"]
    assert m.classification_score("Individual", "Individual", classes) == 1.0
    # "Location" is not in "Other location" (case-sensitive): two matches
    assert m.classification_score("Location or Other location", "Other location",
                                  classes) == 0.5
    # a class inside the truth is dropped
    assert m.classification_score("location or Other location", "Other location",
                                  ["location", "Other location"]) == 1.0
    assert m.classification_score("Individual or Location", "Individual", classes) == 0.5
    # "a" is removed, the list shifts and "ab" is never looked at: 2 matches remain
    assert m.classification_score("abc", "abc", ["a", "ab", "abc"]) == 0.5


def test_retrieval_count_code():
    assert m.retrieval_score("Paragraph 2", "Paragraph 2") == 1.0
    assert m.retrieval_score("Paragraph 2 or 12", "Paragraph 2") == 0.5
    assert m.count_score("There are 3 unique, not 4", "3") == 0.5
    assert m.count_score("none", "3") == 0.0
    assert m.code_sim_score("\n# comment\n    return 2 * (w + h)\nx", "    return 2 * (w + h)") \
        == 1.0
    assert m.code_sim_score("abcd", "abce") == 0.75  # difflib: 2 * 3 / 8
    assert m.code_sim_score("```", "x = 1") == 0.0


def test_score_prediction_rules():
    pred = "\nMara Quill\nsomething else"
    assert m.score_prediction("triviaqa", pred, ["Mara Quill"], None) == 1.0  # first line
    # narrativeqa scores the whole text: P = 2/4, R = 1
    assert m.score_prediction("narrativeqa", pred, ["Mara Quill"], None) == pytest.approx(2 / 3)
    assert m.score_prediction("qasper", "red", ["It was red", "red"], None) == 1.0  # max
    assert m.score_prediction("trec", "Individual\nDate", ["Individual"],
                              ["Date", "Individual"]) == 1.0


def test_spec_matches_longbench_config():
    assert set(spec.TASKS) == set(m.METRICS)
    assert spec.max_new_tokens("gov_report") == 512 and spec.max_new_tokens("hotpotqa") == 32
    assert spec.prompt_template("lcc") == "Please complete the code given below. \n{context}" \
                                          "Next line of code:\n"
    assert len(spec.CATEGORIES) == 6 and len(spec.TASKS) == 16
