"""Data of the mini-replication (``mini_replication.py``): generated documents whose answer
at the end depends on a fact stated far before it, a tokenizer, and the training prefixes.

Three kinds of document, all ending with the recall of a fact stated earlier:

* ``passkey``: the landmark-attention passkey format the evaluation tool uses (its intro,
  its repeated filler, its needle and question, from :mod:`megatron_endprompt.evaluation.tasks`),
  with the answer appended: ``... What is the pass key? The pass key is 12345.``
* ``niah``: the RULER-style single-needle format of the evaluation tool (its intro, its essay
  haystack sentences, its needle and question), answer appended.
* ``fact``: :func:`megatron_endprompt.data.synthetic.document` (the repo's own corpus: a fact
  at the start, its recall at the end).

Where the fact goes: in base-pretraining documents (at most ``L0`` tokens) at a uniform depth
of the haystack; in fine-tuning documents (``L0`` to ``L`` tokens) within the first
``fact_span`` haystack tokens, so that every document carries a dependency across (nearly) its
whole length -- the property of the repo's synthetic corpus, and the dependency that
EndPrompt's terminal anchoring targets. Every method is fine-tuned on the same documents.
Keys and haystacks are drawn from a seed distinct from the evaluation's prompts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import numpy as np

from megatron_endprompt.data import synthetic
from megatron_endprompt.evaluation import tasks as T

KINDS = ("passkey", "niah", "fact")
KIND_PROBS = (0.45, 0.45, 0.1)

_PASSKEY_SENTS = [s if s.endswith(".") else s + "." for s in T.PASSKEY_FILLER.split(". ")]
_ESSAY = T._essay_pool()  # the NIAH haystack sentences of the evaluation tool


def _draw_key(rng: np.random.Generator) -> str:
    i = int(rng.integers(len(T._ADJECTIVES) * len(T._NOUNS)))
    return f"{T._ADJECTIVES[i // len(T._NOUNS)]}-{T._NOUNS[i % len(T._NOUNS)]}"


def document(rng: np.random.Generator, kind: str, n_tokens: int,
             count: Callable[[str], int], fact_span: int | None) -> str:
    """One document of about ``n_tokens`` tokens (``count`` measures a text piece).
    ``fact_span=None``: the fact at a uniform depth of the haystack; else within its first
    ``fact_span`` tokens."""
    if kind == "fact":
        name, key = str(rng.choice(synthetic.NAMES)), int(rng.integers(10000, 99999))
        head = f"The pass key of {name} is {key}."
        tail = f" The pass key of {name} was {key}."
        sents = []
        budget = n_tokens - count(head) - count(tail)
        while budget > 0:
            s = synthetic.sentence(rng)
            sents.append(" " + s)
            budget -= count(" " + s)
        return head + "".join(sents) + tail
    if kind == "passkey":
        key = int(rng.integers(1, 50001))
        intro, needle = T.PASSKEY_INTRO, " " + T.passkey_needle(key)
        tail = "\n" + T.PASSKEY_QUESTION + f" {key}."
        pool, start = _PASSKEY_SENTS, int(rng.integers(len(_PASSKEY_SENTS)))
        draw = lambda i: pool[(start + i) % len(pool)]  # noqa: E731 - the filler repeats
    else:
        key, value = _draw_key(rng), str(int(rng.integers(1_000_000, 10_000_000)))
        intro, needle = T.NIAH_INTRO, " " + T.niah_needle(key, value)
        tail = "\n" + T.NIAH_QUESTION.format(query=key) + f" {value}."
        picks = rng.integers(0, len(_ESSAY), size=4 * n_tokens)
        draw = lambda i: _ESSAY[int(picks[i % len(picks)])]  # noqa: E731
    budget = n_tokens - count(intro + "\n") - count(needle) - count(tail)
    hay, lens = [], []
    while sum(lens) < budget:
        s = " " + draw(len(hay))
        hay.append(s)
        lens.append(count(s))
    ends = np.cumsum([0] + lens)
    if fact_span is None:
        at = int(rng.integers(0, len(hay) + 1))
    else:
        at = int(rng.integers(0, max(1, int(np.searchsorted(ends, fact_span, "right")))))
    body = "".join(hay[:at]) + needle + "".join(hay[at:])
    return intro + "\n" + body.lstrip(" ") + tail


def write_docs(path: str, *, num_docs: int, min_tokens: int, max_tokens: int, seed: int,
               count: Callable[[str], int], fact_span: int | None) -> str:
    """``num_docs`` JSONL documents ``{"text", "kind"}`` of ``min..max`` tokens."""
    rng = np.random.default_rng(seed)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for _ in range(num_docs):
            kind = str(rng.choice(KINDS, p=KIND_PROBS))
            n = int(rng.integers(min_tokens, max_tokens + 1))
            f.write(json.dumps({"text": document(rng, kind, n, count, fact_span),
                                "kind": kind}) + "\n")
    os.replace(path + ".tmp", path)
    return path


def make_tokenizer(workdir: str, *, vocab_size: int, num_docs: int = 600) -> str:
    """A SentencePiece model (the repo's :func:`~megatron_endprompt.data.synthetic.train_sentencepiece`)
    trained on a short sample of every document kind."""
    rough = lambda text: max(1, len(text) // 3)  # noqa: E731 - characters per token, roughly
    sample = write_docs(os.path.join(workdir, "tokenizer_corpus.jsonl"), num_docs=num_docs,
                        min_tokens=60, max_tokens=300, seed=7, count=rough, fact_span=None)
    return synthetic.train_sentencepiece(sample, os.path.join(workdir, "tokenizer"),
                                         vocab_size=vocab_size)


def token_counter(spm_model: str) -> Callable[[str], int]:
    """Exact mid-text token count of a piece under the SentencePiece model (cached)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=spm_model)
    cache: dict[str, int] = {}

    def count(text: str) -> int:
        n = cache.get(text)
        if n is None:
            n = cache[text] = len(sp.encode(text))
        return n
    return count


def write_plain_prefix(jsonl: str, prefix: str, spm_model: str) -> int:
    """Megatron ``.bin/.idx`` without a sidecar (plain data: contiguous positions), tokenized
    by the same Megatron-Core tokenizer as preprocessing, EOD appended; returns its tokens."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    from megatron_endprompt.data.tokenizer import TokenizerSpec, build_tokenizer

    tok = build_tokenizer(TokenizerSpec(tokenizer_type="GPTSentencePieceTokenizer",
                                        tokenizer_model=spm_model))
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(tok.vocab_size))
    total = 0
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            ids = np.asarray(tok.tokenize(json.loads(line)["text"]) + [tok.eod], dtype=np.int64)
            builder.add_document(ids, [len(ids)])
            total += len(ids)
    builder.finalize(prefix + ".idx")
    return total
