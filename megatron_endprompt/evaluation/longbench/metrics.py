"""LongBench's official per-prediction metrics, re-implemented from their definitions.

Source: github.com/THUDM/LongBench (commit 2e00731), ``LongBench/metrics.py`` (the metric
functions) and ``LongBench/eval.py`` (``dataset2metric`` and ``scorer``). LongBench computes
ROUGE-L with the ``rouge`` package (pltrdy/rouge 1.0.1, ``rouge/rouge_score.py``
``rouge_l_summary_level`` with ``exclusive=True``) and edit similarity with
``fuzzywuzzy.fuzz.ratio``; its requirements do not install python-Levenshtein, so that ratio is
``difflib.SequenceMatcher(None, a, b).ratio()`` (stdlib) rounded to an integer percent. We
follow those definitions here (no extra dependency); the Chinese metrics (jieba word
segmentation) are not implemented, so the Chinese tasks are not offered (see ``longbench_spec``).

Every metric takes ``(prediction, ground_truth, all_classes)`` and returns a float in [0, 1];
``score_prediction`` applies LongBench's rule: max over the answers, and for trec / triviaqa /
samsum / lsht only the first line of the prediction.
"""

from __future__ import annotations

import difflib
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

__all__ = ["normalize_answer", "qa_f1_score", "rouge_score", "rouge_l", "classification_score",
           "retrieval_score", "count_score", "code_sim_score", "METRICS", "FIRST_LINE_TASKS",
           "score_prediction"]

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_DIGITS = re.compile(r"\d+")


def normalize_answer(text: str) -> str:
    """LongBench ``normalize_answer`` (SQuAD's): lower case, drop ASCII punctuation, then the
    articles a/an/the, then collapse white space."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _f1(prediction: Sequence[str], truth: Sequence[str]) -> float:
    """Token-multiset F1 (LongBench ``f1_score``)."""
    same = sum((Counter(prediction) & Counter(truth)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction), same / len(truth)
    return 2 * precision * recall / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, all_classes: Sequence[str] = ()) -> float:
    """LongBench ``qa_f1_score``: F1 of the whitespace tokens of the normalized strings."""
    return _f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def _sentences(text: str) -> list[str]:
    """pltrdy/rouge ``Rouge._get_scores``: split at ``.``, drop empty pieces, squeeze spaces."""
    return [" ".join(s.split()) for s in text.split(".") if len(s) > 0]


def _words(sentences: Sequence[str]) -> list[str]:
    return [w for s in sentences for w in s.split(" ")]


def _lcs_words(ref: list[str], hyp: list[str]) -> set[str]:
    """The words of one longest common subsequence of ``ref`` and ``hyp``, reconstructed as
    pltrdy/rouge ``_recon_lcs`` does (on a tie it steps back in ``hyp``), as a set
    (``exclusive=True``)."""
    n, m = len(ref), len(hyp)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            table[i][j] = (table[i - 1][j - 1] + 1 if ref[i - 1] == hyp[j - 1]
                           else max(table[i - 1][j], table[i][j - 1]))
    out: set[str] = set()
    i, j = n, m
    while i > 0 and j > 0:
        if ref[i - 1] == hyp[j - 1]:
            out.add(ref[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return out


def rouge_l(prediction: str, ground_truth: str) -> float:
    """ROUGE-L F as LongBench gets it (pltrdy/rouge ``rouge_l_summary_level``, exclusive): the
    texts are split into sentences at ``.``; ``m``/``n`` = distinct words of the reference /
    prediction; for each reference sentence the words of its LCS with every prediction sentence
    join one running set, whose growth is summed into ``llcs``; ``F = 2PR / (P + R + 1e-8)``
    with ``P = llcs / n``, ``R = llcs / m``. Raises ``ValueError`` on an empty side (as the
    package does). The package recurses to rebuild an LCS and so fails (score 0) on sentences
    longer than Python's recursion limit; we rebuild it iteratively and score them."""
    hyp, ref = _sentences(prediction), _sentences(ground_truth)
    if not hyp or not ref:
        raise ValueError("Collections must contain at least 1 sentence.")
    m, n = len(set(_words(ref))), len(set(_words(hyp)))
    union: set[str] = set()
    llcs = 0
    for ref_s in ref:
        before = len(union)
        ref_words = ref_s.split(" ")
        for hyp_s in hyp:
            union |= _lcs_words(ref_words, hyp_s.split(" "))
        llcs += len(union) - before
    r, p = llcs / m, llcs / n
    return 2.0 * (p * r) / (p + r + 1e-8)


def rouge_score(prediction: str, ground_truth: str, all_classes: Sequence[str] = ()) -> float:
    """LongBench ``rouge_score``: ROUGE-L F (:func:`rouge_l`), 0.0 when it cannot be computed."""
    try:
        return rouge_l(prediction, ground_truth)
    except ValueError:
        return 0.0


def classification_score(prediction: str, ground_truth: str,
                         all_classes: Sequence[str] = ()) -> float:
    """LongBench ``classification_score``: the classes named in the prediction, less those that
    are a proper substring of the truth (LongBench removes them while iterating the list, so a
    removal skips the next element; kept as is); ``1 / len(matches)`` when the truth is among
    them."""
    matches = [c for c in all_classes if c in prediction]
    i = 0  # Python's list iterator: the index advances even after a removal
    while i < len(matches):
        term = matches[i]
        if term in ground_truth and term != ground_truth:
            matches.remove(term)
        i += 1
    return 1.0 / len(matches) if ground_truth in matches else 0.0


def _id_score(prediction: str, truth_id: str) -> float:
    numbers = _DIGITS.findall(prediction)
    return sum(1 for x in numbers if x == truth_id) / len(numbers) if numbers else 0.0


def retrieval_score(prediction: str, ground_truth: str, all_classes: Sequence[str] = ()) -> float:
    """LongBench ``retrieval_score``: the paragraph id of ``"Paragraph N"`` in the truth; the
    share of the numbers in the prediction that equal it."""
    found = re.findall(r"Paragraph (\d+)", ground_truth)
    if not found:
        raise ValueError(f"passage_retrieval answer {ground_truth!r} has no 'Paragraph N'")
    return _id_score(prediction, found[0])


def count_score(prediction: str, ground_truth: str, all_classes: Sequence[str] = ()) -> float:
    """LongBench ``count_score``: the share of the numbers in the prediction that equal the
    truth."""
    return _id_score(prediction, str(ground_truth))


def code_sim_score(prediction: str, ground_truth: str, all_classes: Sequence[str] = ()) -> float:
    """LongBench ``code_sim_score``: the first line of the prediction (leading newlines
    stripped) with no backtick, ``#`` or ``//`` (else ``""``), compared by
    ``fuzzywuzzy.fuzz.ratio`` / 100: 1.0 for equal strings, 0.0 when one is empty, else
    ``round(100 * difflib.SequenceMatcher(None, a, b).ratio()) / 100``."""
    line = next((x for x in prediction.lstrip("\n").split("\n")
                 if "`" not in x and "#" not in x and "//" not in x), "")
    if line == ground_truth:
        return 1.0
    if not line or not ground_truth:
        return 0.0
    return int(round(100 * difflib.SequenceMatcher(None, line, ground_truth).ratio())) / 100


#: LongBench ``eval.py`` ``dataset2metric`` (English tasks).
METRICS: dict[str, Callable[..., float]] = {
    "narrativeqa": qa_f1_score, "qasper": qa_f1_score, "multifieldqa_en": qa_f1_score,
    "hotpotqa": qa_f1_score, "2wikimqa": qa_f1_score, "musique": qa_f1_score,
    "gov_report": rouge_score, "qmsum": rouge_score, "multi_news": rouge_score,
    "trec": classification_score, "triviaqa": qa_f1_score, "samsum": rouge_score,
    "passage_retrieval_en": retrieval_score, "passage_count": count_score,
    "lcc": code_sim_score, "repobench-p": code_sim_score,
}
#: LongBench ``scorer``: these tasks score only the first line of the prediction.
FIRST_LINE_TASKS = ("trec", "triviaqa", "samsum", "lsht")


def score_prediction(task: str, prediction: str, answers: Sequence[str],
                     all_classes: Sequence[str] | None) -> float:
    """LongBench ``scorer`` for one prediction: max of the task's metric over the answers
    (0.0 for none)."""
    if task in FIRST_LINE_TASKS:
        prediction = prediction.lstrip("\n").split("\n")[0]
    metric = METRICS[task]
    best = 0.0
    for truth in answers:
        best = max(best, metric(prediction, truth, all_classes=list(all_classes or ())))
    return best
