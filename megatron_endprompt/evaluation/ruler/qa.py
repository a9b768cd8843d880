"""RULER's ``qa_1`` (SQuAD) and ``qa_2`` (HotpotQA) from local files.

Carried from NVIDIA/RULER (commit c3f5e3b): ``scripts/data/synthetic/qa.py`` (readers, document
format, haystack search), ``scripts/data/synthetic/constants.py`` ``TASKS['qa']`` (template,
answer prefix, 32 tokens to generate), ``scripts/synthetic.yaml`` (qa_1 = squad, qa_2 =
hotpotqa) and ``scripts/eval/synthetic/constants.py`` (metric ``string_match_part``).

``--qa-dir DIR`` holds RULER's downloads: ``DIR/squad.json`` (SQuAD v2.0 dev:
``data[].paragraphs[].{context, qas[].{question, answers[].text, is_impossible}}``) and
``DIR/hotpotqa.json`` (HotpotQA dev distractor: ``[{question, answer, context: [[title,
[sentences]]]}]``). Documents are the distinct paragraphs, sorted; sample ``i`` asks question
``i``; its gold documents plus distractors (SQuAD: first the other paragraphs of the same
article) are shuffled with ``random.Random(seed)`` and numbered ``Document {i}:\\n{doc}``. The
document count is RULER's binary search (from 10, step 10) so that prompt + 32 tokens fit.
"""

from __future__ import annotations

import json
import os
import random
from functools import lru_cache
from typing import Any

from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation.core.prompt import PromptSample, TextTokens

__all__ = ["QA_TASKS", "QA_TEMPLATE", "QA_ANSWER_PREFIX", "QA_TOKENS", "load_qa",
           "check_length", "render_qa", "make_qa_samples"]

#: Our name -> (RULER dataset, file in --qa-dir).
QA_TASKS = {"qa_1": ("squad", "squad.json"), "qa_2": ("hotpotqa", "hotpotqa.json")}
QA_TEMPLATE = ("Answer the question based on the given documents. Only give me the answer and "
               "do not output any other words.\n\nThe following are given documents.\n\n"
               "{context}\n\nAnswer the question based on the given documents. Only give me "
               "the answer and do not output any other words.\n\nQuestion: {query}")
QA_ANSWER_PREFIX = " Answer:"
QA_TOKENS = 32
DOCUMENT_PROMPT = "Document {i}:\n{document}"
INCREMENT = 10


def _read_squad(data: Any) -> tuple[list[dict[str, Any]], list[str]]:
    docs = sorted({p["context"] for d in data["data"] for p in d["paragraphs"]})
    index = {c: i for i, c in enumerate(docs)}
    qas = []
    for d in data["data"]:
        article = [index[p["context"]] for p in d["paragraphs"]]
        for p in d["paragraphs"]:
            own = index[p["context"]]
            for qa in p["qas"]:
                if not qa.get("is_impossible", False):
                    qas.append({"query": qa["question"],
                                "outputs": [a["text"] for a in qa["answers"]],
                                "context": [own],
                                "more_context": [i for i in article if i != own]})
    return qas, docs


def _read_hotpot(data: Any) -> tuple[list[dict[str, Any]], list[str]]:
    text = lambda t, p: f"{t}\n{''.join(p)}"  # noqa: E731
    docs = sorted({text(t, p) for d in data for t, p in d["context"]})
    index = {c: i for i, c in enumerate(docs)}
    qas = [{"query": d["question"], "outputs": [d["answer"]],
            "context": [index[text(t, p)] for t, p in d["context"]]} for d in data]
    return qas, docs


@lru_cache(maxsize=4)
def load_qa(qa_dir: str, task: str) -> tuple[tuple[dict[str, Any], ...], tuple[str, ...]]:
    """``(questions, documents)`` of ``task`` from ``qa_dir`` (RULER's readers)."""
    dataset, name = QA_TASKS[task]
    path = os.path.join(qa_dir, name)
    if not os.path.isfile(path):
        raise UserError(f"--qa-dir {qa_dir}: no {name} for {task} (RULER's {dataset} file); "
                        "put RULER's download there")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        qas, docs = _read_squad(data) if dataset == "squad" else _read_hotpot(data)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise UserError(f"--qa-dir: {path} is not in RULER's {dataset} format "
                        f"({type(exc).__name__}: {exc})") from None
    if not qas:
        raise UserError(f"--qa-dir: {path} has no answerable question")
    return tuple(qas), tuple(docs)


def render_qa(qas: Any, docs: Any, index: int, num_docs: int, rng: random.Random,
              seed: int) -> tuple[str, list[str]]:
    """RULER ``generate_input_output``: the prompt (template + answer prefix) of question
    ``index`` with ``num_docs`` documents, and its answers."""
    qa = qas[index]
    gold, more = list(qa["context"]), list(qa.get("more_context", []))
    if num_docs < min(len(gold), len(docs)):
        raise ValueError(f"question {index} has {len(gold)} gold paragraph(s); {num_docs} "
                         "document(s) cannot hold them")
    if num_docs < len(docs):
        if num_docs - len(gold) > len(more):
            pool = [i for i in range(len(docs)) if i not in gold + more]
            chosen = gold + more + rng.sample(pool, max(0, num_docs - len(gold) - len(more)))
        else:
            chosen = gold + rng.sample(more, num_docs - len(gold))
        texts = [docs[i] for i in chosen]
    else:
        texts = (list(docs) * ((num_docs + len(docs) - 1) // len(docs)))[:num_docs]
    random.Random(seed).shuffle(texts)
    context = "\n\n".join(DOCUMENT_PROMPT.format(i=i + 1, document=d)
                          for i, d in enumerate(texts))
    return QA_TEMPLATE.format(context=context, query=qa["query"]) + QA_ANSWER_PREFIX, \
        list(qa["outputs"])


def _fit(qas: Any, docs: Any, tokens: TextTokens, length: int, rng: random.Random,
         seed: int) -> int:
    """RULER's binary search over the document count (question 0)."""
    budget = length - QA_TOKENS
    per_doc = tokens.count(render_qa(qas, docs, 0, INCREMENT, rng, seed)[0]) / INCREMENT
    lower, upper = INCREMENT, max(int(length / per_doc * 3), INCREMENT * 2)
    best = None
    while lower <= upper:
        mid = (lower + upper) // 2
        if tokens.count(render_qa(qas, docs, 0, mid, rng, seed)[0]) <= budget:
            best, lower = mid, mid + 1
        else:
            upper = mid - 1
    return best if best is not None else INCREMENT


def _too_short(task: str, length: int, index: int, gold: int, need: int) -> ValueError:
    return ValueError(f"{task}: length {length} is too short for question {index} even with "
                      f"only its {gold} gold paragraph(s) ({need} tokens with the {QA_TOKENS} "
                      "to generate); use a longer length")


def check_length(task: str, tokens: TextTokens, *, qa_dir: str, length: int, samples: int,
                 seed: int) -> None:
    """Raise ``ValueError`` when a question of the first ``samples`` does not fit ``length``
    even with its gold paragraphs alone (RULER's generator then fails on a negative
    ``random.sample``); cheap: one short prompt per question, before the model loads."""
    qas, docs = load_qa(qa_dir, task)
    for index in range(min(samples, len(qas))):
        gold = len(qas[index]["context"])
        text, _ = render_qa(qas, docs, index, max(1, min(gold, len(docs))),
                            random.Random(f"{seed}:{task}:{length}:{index}"), seed)
        need = tokens.count(text) + QA_TOKENS
        if need > length:
            raise _too_short(task, length, index, gold, need)


def make_qa_samples(task: str, tokens: TextTokens, *, qa_dir: str, length: int, samples: int,
                    seed: int) -> list[PromptSample]:
    """``samples`` prompts of ``task`` at ``length`` (question ``i`` for sample ``i``).
    RULER steps the document count down by 10 while a sample does not fit (and loops forever
    below 10); we then step by 1 and raise ``ValueError`` when not even one document fits."""
    qas, docs = load_qa(qa_dir, task)
    if samples > len(qas):
        raise UserError(f"--samples {samples}: {task} has only {len(qas)} questions in "
                        f"--qa-dir {qa_dir}")
    n = _fit(qas, docs, tokens, length, random.Random(f"{seed}:{task}:{length}:fit"), seed)
    out = []
    for index in range(samples):
        used = n
        while True:
            rng = random.Random(f"{seed}:{task}:{length}:{index}")
            text, answers = render_qa(qas, docs, index, used, rng, seed)
            ids = tokens.array(text)
            if len(ids) + QA_TOKENS <= length:
                break
            gold = len(qas[index]["context"])
            if used <= max(1, gold):
                raise _too_short(task, length, index, gold, len(ids) + QA_TOKENS)
            used = max(used - (INCREMENT if used > INCREMENT else 1), gold)
        out.append(PromptSample(task=task, length=length, index=index, input_ids=ids,
                                answers=tuple(answers), metric="string_match_part",
                                max_new_tokens=QA_TOKENS, prompt=text,
                                extra={"haystack_units": used}))
    return out
