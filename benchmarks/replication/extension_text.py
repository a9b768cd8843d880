"""Text of the extension protocol (``extension.py``): natural documents, the base's retrieval
templates, and the tokenizer's corpus.

* **Natural text**: ``tinyshakespeare.txt`` (the shared corpus) cut at blank lines into
  speeches, speeches joined into documents of a drawn token length; its first 60% feeds the
  base, its last 40% the extension fine-tuning. **Generated prose**: sentences of
  :func:`megatron_endprompt.data.prepare.synthetic.sentence` with no fact and no recall.
  Neither holds a question, a key or an answer: the fine-tuning text carries no evaluator
  template.
* **Retrieval templates of the base** (pretraining only, at ``L0``): paraphrases of the
  evaluator's two tasks -- a number hidden in filler, asked for at the end, with its answer --
  in wordings the evaluator never uses (:data:`PASSKEY_VARIANTS`, :data:`NIAH_VARIANTS`), so
  the evaluator's own templates (landmark passkey, RULER ``niah_single_1``) are held out: the
  base learns to retrieve, not to complete one sentence.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator

import numpy as np

from benchmarks.replication import data
from megatron_endprompt.data.prepare import synthetic
from megatron_endprompt.disk import atomic_path
from megatron_endprompt.evaluation.passkey import passkey as PK
from megatron_endprompt.evaluation.ruler.sources import random_value
from megatron_endprompt.evaluation.ruler.spec import NOISE_HAYSTACK

Count = Callable[[str], int]

#: Share of the corpus (by speech) the base reads; the fine-tuning reads the rest.
BASE_SHARE = 0.6

#: Passkey paraphrases: (task line, key line, question); ``{k}`` is the key.
PASSKEY_VARIANTS = (
    ("A secret number is hidden somewhere in the text below. Keep it in mind; you will be "
     "asked for it.", "The secret number is {k}. Keep it in mind. {k} is the secret number.",
     "What was the secret number? The secret number is"),
    ("Read the following text carefully and remember the access code in it.",
     "The access code is {k}. Do not forget it. {k} is the access code.",
     "Which access code was given? The access code is"),
    ("Somewhere below a lock combination is written down. Remember it.",
     "The lock combination is {k}. Write it down. {k} is the lock combination.",
     "Tell me the lock combination. The lock combination is"),
)
#: NIAH paraphrases: (task line, needle, question); ``{key}`` a word pair, ``{v}`` 7 digits.
NIAH_VARIANTS = (
    ("Some hidden codes are placed in the text that follows. Remember each code and its name.",
     "The hidden code for {key} is: {v}.",
     "Which hidden code belongs to {key} in the text above? The hidden code for {key} is:"),
    ("The text below contains secret numbers with their labels. Memorize them.",
     "Note that the secret number labelled {key} is: {v}.",
     "What is the secret number labelled {key}? The secret number labelled {key} is:"),
    ("Read the notes below; a few registration numbers are among them.",
     "Record: the registration number of {key} is: {v}.",
     "Find the registration number of {key}. The registration number of {key} is:"),
)
#: Base pretraining mix: kinds and weights.
BASE_KINDS = ("passkey", "niah", "shakespeare", "prose")
BASE_PROBS = (0.3, 0.3, 0.25, 0.15)
#: The base's second stage: mostly templates (retrieval had not emerged after the first).
BASE_MORE_PROBS = (0.425, 0.425, 0.1, 0.05)


def speeches(corpus: str) -> list[str]:
    """The corpus cut at blank lines (a speech: speaker line and its verse)."""
    with open(corpus, encoding="utf-8") as f:
        text = f.read()
    return [s.strip() for s in text.split("\n\n") if s.strip()]


def split_speeches(corpus: str) -> tuple[list[str], list[str]]:
    """(base speeches, fine-tuning speeches): the first ``BASE_SHARE`` and the rest."""
    sp = speeches(corpus)
    cut = int(len(sp) * BASE_SHARE)
    return sp[:cut], sp[cut:]


def _join_to(parts: Iterator[str], n: int, count: Count, sep: str) -> str:
    """Parts joined until the next would pass ``n`` tokens (at least one part, cut by words
    to fit when that one alone is too long)."""
    out: list[str] = []
    for p in parts:
        cand = sep.join([*out, p])
        if count(cand) > n:
            if not out:  # one speech longer than n: its first words
                words = p.split(" ")
                lo, hi = 1, len(words)
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if count(" ".join(words[:mid])) <= n:
                        lo = mid
                    else:
                        hi = mid - 1
                out = [" ".join(words[:lo])]
            break
        out.append(p)
    return sep.join(out)


def _cycle(items: list[str], start: int) -> Iterator[str]:
    i = start
    while True:
        yield items[i % len(items)]
        i += 1


def prose(rng: np.random.Generator, n: int, count: Count) -> str:
    """Generated sentences (no fact, no recall) up to ``n`` tokens."""
    return _join_to(iter(lambda: synthetic.sentence(rng), None), n, count, " ")


def passkey_variant(rng: random.Random, n: int, count: Count, filler: str) -> str:
    """A passkey paraphrase of at most ``n`` tokens with its answer: task line, filler, the key
    line at a uniform depth, filler, question, `` KEY.``"""
    task, line, question = PASSKEY_VARIANTS[rng.randrange(len(PASSKEY_VARIANTS))]
    key = rng.randint(1, 50000)
    depth = rng.random()

    def text(chars: int) -> str:
        pre = int(chars * depth)
        return "\n".join([task, filler[:pre], line.format(k=key), filler[pre:chars],
                          question]) + f" {key}."
    chars = PK.largest_fitting(lambda c: count(text(c)) <= n, len(filler)) or 0
    return text(chars)


def niah_variant(rng: random.Random, n: int, count: Count, filler: list[str]) -> str:
    """A NIAH paraphrase of at most ``n`` tokens with its answer (7-digit value, word-pair key
    as RULER draws them, from this generator's seeds)."""
    task, needle, question = NIAH_VARIANTS[rng.randrange(len(NIAH_VARIANTS))]
    key, v = random_value(rng, "words"), random_value(rng, "numbers")
    at_frac = rng.random()

    def text(units: int) -> str:
        sents = list(filler[:units])
        sents.insert(int(units * at_frac), needle.format(key=key, v=v))
        return "\n".join([task, *sents, question.format(key=key)]) + f" {v}."
    units = PK.largest_fitting(lambda u: count(text(u)) <= n, len(filler)) or 0
    return text(units)


def _filler(rng: random.Random, nprng: np.random.Generator, pool: list[str]) -> list[str]:
    """Filler sentences of a template document: the evaluator's noise, prose or verse."""
    kind = rng.randrange(3)
    if kind == 0:
        return [NOISE_HAYSTACK] * 400
    if kind == 1:
        return [synthetic.sentence(nprng) for _ in range(400)]
    start = rng.randrange(len(pool))
    lines = [ln for s in (pool[(start + i) % len(pool)] for i in range(60))
             for ln in s.splitlines()]
    return lines[:400]


def write_base_docs(path: str, *, corpus: str, num_docs: int, min_tokens: int,
                    max_tokens: int, seed: int, count: Count,
                    probs: tuple[float, ...] = BASE_PROBS) -> dict[str, int]:
    """The base's pretraining documents (``BASE_KINDS`` mixed by ``probs``) as JSONL
    ``{"text", "kind"}``; returns documents per kind."""
    pool, _ = split_speeches(corpus)
    rng = random.Random(f"extension-base:{seed}")
    nprng = np.random.default_rng(seed)
    kinds: dict[str, int] = {}
    with atomic_path(path, fsync=False) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for _ in range(num_docs):
            kind = rng.choices(BASE_KINDS, weights=probs)[0]
            n = rng.randint(min_tokens, max_tokens)
            if kind == "passkey":
                text = passkey_variant(rng, n, count, " ".join(_filler(rng, nprng, pool)))
            elif kind == "niah":
                text = niah_variant(rng, n, count, _filler(rng, nprng, pool))
            elif kind == "shakespeare":
                text = _join_to(_cycle(pool, rng.randrange(len(pool))), n, count, "\n\n")
            else:
                text = prose(nprng, n, count)
            kinds[kind] = kinds.get(kind, 0) + 1
            f.write(json.dumps({"text": text, "kind": kind}) + "\n")
    return kinds


def write_natural_docs(path: str, *, corpus: str, num_docs: int, min_tokens: int,
                       max_tokens: int, seed: int, count: Count,
                       prose_share: float = 0.3) -> dict[str, int]:
    """The extension fine-tuning documents: the corpus' held-out speeches in order, joined to
    ``min..max`` tokens, and generated prose (``prose_share`` of the documents). No template,
    no question, no answer."""
    _, pool = split_speeches(corpus)
    rng = random.Random(f"extension-ft:{seed}")
    nprng = np.random.default_rng(seed)
    it = _cycle(pool, 0)
    kinds = {"shakespeare": 0, "prose": 0}
    with atomic_path(path, fsync=False) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for _ in range(num_docs):
            n = rng.randint(min_tokens, max_tokens)
            if rng.random() < prose_share:
                kind, text = "prose", prose(nprng, n, count)
            else:
                kind, text = "shakespeare", _join_to(it, n, count, "\n\n")
            kinds[kind] += 1
            f.write(json.dumps({"text": text, "kind": kind}) + "\n")
    return kinds


def write_tokenizer_corpus(path: str, *, corpus: str, num_docs: int) -> str:
    """A short sample of every kind of text the protocol shows a model (the base's mix, the
    fine-tuning text, and the evaluator's templates, which the tokenizer must cover)."""
    rough = lambda text: max(1, len(text) // 3)  # noqa: E731 - characters per token, roughly
    write_base_docs(path + ".base", corpus=corpus, num_docs=num_docs, min_tokens=60,
                    max_tokens=300, seed=7, count=rough)
    data.write_docs(path + ".eval", num_docs=num_docs // 4, min_tokens=60, max_tokens=300,
                    seed=8, count=rough, fact_span=None, kinds=("passkey", "niah"),
                    probs=(0.5, 0.5))
    _, ft = split_speeches(corpus)
    with atomic_path(path, fsync=False) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for part in (path + ".base", path + ".eval"):
            with open(part, encoding="utf-8") as src:
                f.write(src.read())
        for i in range(0, min(len(ft), num_docs), 4):
            f.write(json.dumps({"text": "\n\n".join(ft[i:i + 4])}) + "\n")
    return path


def consumed_speeches(corpus: str, fine_tuning: str) -> int:
    """How many speeches of the corpus' fine-tuning share :func:`write_natural_docs` read into
    ``fine_tuning``: the index after the last speech it holds (it reads them in order, skipping
    the one that overflows a document and cutting one longer than a document to its first
    words). Refuses (one ``error:`` line) a file whose speeches are not the share's in order:
    one written from another corpus, or one that wrapped around the share (nothing held out)."""
    _, pool = split_speeches(corpus)
    j = 0
    with open(fine_tuning, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            doc = json.loads(line)
            if doc.get("kind") != "shakespeare":
                continue
            for part in doc["text"].split("\n\n"):
                while j < len(pool) and not (pool[j] == part or pool[j].startswith(part)):
                    j += 1
                if j == len(pool):
                    raise SystemExit(f"error: {fine_tuning}:{n}: its speeches are not the "
                                     f"fine-tuning share of {corpus} in order (or they wrap "
                                     "around it: nothing held out); rewrite it or lower "
                                     "--ft-iters")
                j += 1
    return j


def write_heldout_docs(path: str, *, corpus: str, fine_tuning: str, num_docs: int,
                       min_tokens: int, count: Count) -> dict:
    """Held-out natural text for perplexity: the speeches of the corpus' fine-tuning share (so
    the base never read them either) after the last one the fine-tuning JSONL ``fine_tuning``
    holds (:func:`consumed_speeches`), consecutive speeches joined until a document has
    ``min_tokens`` tokens; ``num_docs`` documents, or one ``error:`` line. Returns ``{"docs",
    "first_speech", "speeches"}`` (indices into the fine-tuning share)."""
    _, pool = split_speeches(corpus)
    first = consumed_speeches(corpus, fine_tuning)
    docs: list[str] = []
    parts: list[str] = []
    for speech in pool[first:]:
        if len(docs) == num_docs:
            break
        parts.append(speech)
        if count("\n\n".join(parts)) >= min_tokens:
            docs.append("\n\n".join(parts))
            parts = []
    if len(docs) < num_docs:
        raise SystemExit(f"error: {corpus}: {len(docs)} held-out documents of {min_tokens} "
                         f"tokens after the fine-tuning text, not {num_docs}; lower "
                         "--ppl-docs or --ft-iters")
    with atomic_path(path, fsync=False) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d, "kind": "shakespeare"}) + "\n")
    taken = sum(d.count("\n\n") + 1 for d in docs)
    return {"docs": len(docs), "first_speech": first, "speeches": taken}
