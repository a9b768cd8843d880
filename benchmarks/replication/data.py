"""Data of the mini-replication (``mini_replication.py``): generated documents whose end recalls
a fact stated earlier, a tokenizer, and the training prefixes.

Three kinds of document, each ending with the recall of a fact stated before it:

* ``passkey``: the evaluator's landmark-attention passkey prompt
  (:func:`megatron_endprompt.evaluation.passkey.passkey.passkey_prompt`: task line, repeated
  garbage, the key line, garbage, question) with the answer appended: ``... The pass key is 123.``;
* ``niah``: the evaluator's RULER ``niah_single_1`` prompt (noise haystack, ``adjective-noun``
  key, 7-digit value; RULER's singular template from
  :func:`megatron_endprompt.evaluation.ruler.niah.niah_template`) with the answer appended;
* ``fact``: :func:`megatron_endprompt.data.prepare.synthetic.document` (the repo's own corpus: a
  fact at the start, its recall at the end; varied sentences, which makes the held-out PPL mean
  something).

Base-pretraining documents (``L0 / 4 .. L0`` tokens) put the fact at a uniform depth.
Fine-tuning documents are ``P`` to ``L - 1`` tokens (uniform; at most: the last haystack unit
may leave a few tokens short), one per training sequence of full-length fine-tuning with its
EOD, and put the fact inside their first ``fact_span`` tokens: the first ``a`` tokens EndPrompt
keeps then hold it, and the recall is in the document's tail -- the long-range dependency
EndPrompt's terminal anchoring targets, spanning the whole document. The varied lengths give
full-length fine-tuning every fact-recall distance up to ``L`` (all ``L - 1`` long, it saw
only ~``L`` and lost retrieval at ``L0``). Every method is fine-tuned on the same documents.
Keys and values come from seeds distinct from the evaluator's prompts.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable

import numpy as np

from megatron_endprompt.data.prepare import synthetic
from megatron_endprompt.evaluation.passkey import passkey as PK
from megatron_endprompt.evaluation.ruler.niah import niah_template
from megatron_endprompt.evaluation.ruler.sources import random_value
from megatron_endprompt.evaluation.ruler.spec import NIAH_NEEDLE, NOISE_HAYSTACK, RULER_TASKS
from megatron_endprompt.disk import atomic_path

KINDS = ("passkey", "niah", "fact")
KIND_PROBS = (0.4, 0.4, 0.2)
NIAH_TASK = RULER_TASKS["niah_single_1"]

Count = Callable[[str], int]


def _largest(fits: Callable[[int], bool], hi: int) -> int:
    """The largest ``n`` in ``[0, hi]`` that fits the budget (0 if none)."""
    return PK.largest_fitting(fits, hi) or 0


def _passkey(rng: random.Random, n: int, count: Count, span: int | None) -> str:
    key = rng.randint(1, 50000)
    text = lambda c, d: PK.passkey_prompt(key, c, d) + f" {key}."  # noqa: E731
    chars = _largest(lambda c: count(text(c, 0.5)) <= n, 8 * n)
    depth = rng.random()
    if span is not None:  # the key line must end within the first ``span`` tokens
        head = lambda d: PK.passkey_prompt(key, chars, d).split(  # noqa: E731
            PK.FINAL_QUESTION)[0].split(PK.passkey_line(key))[0] + PK.passkey_line(key)
        dmax = _largest(lambda i: count(head(i / 1000)) <= span, 1000) / 1000
        depth *= dmax
    while chars > 0 and count(text(chars, depth)) > n:
        chars -= 4
    return text(chars, depth)


def _niah(rng: random.Random, n: int, count: Count, span: int | None) -> str:
    template, type_v = niah_template(NIAH_TASK)
    key, value = random_value(rng, "words"), random_value(rng, "numbers")
    needle = NIAH_NEEDLE.format(type_needle_v=type_v + "s", key=key, value=value)

    def text(units: int, at: int) -> str:
        sents = [NOISE_HAYSTACK] * units
        sents.insert(at, needle)
        return template.format(type_needle_v=type_v, context="\n".join(sents),
                               query=key) + f" {value}."
    units = _largest(lambda u: count(text(u, 0)) <= n, n)
    at = rng.randint(0, units)
    if span is not None:
        top = _largest(lambda i: count(text(units, i).split(needle)[0] + needle) <= span,
                       units)
        at = rng.randint(0, top)
    return text(units, at)


def _fact(rng: random.Random, n: int, count: Count) -> str:
    nrng = np.random.default_rng(rng.getrandbits(32))
    name, key = str(nrng.choice(synthetic.NAMES)), int(nrng.integers(10000, 99999))
    head, tail = f"The pass key of {name} is {key}.", f" The pass key of {name} was {key}."
    sents, budget = [], n - count(head) - count(tail)
    while True:
        s = " " + synthetic.sentence(nrng)
        if budget - count(s) < 0:
            break
        sents.append(s)
        budget -= count(s)
    return head + "".join(sents) + tail


def document(rng: random.Random, kind: str, n_tokens: int, count: Count,
             fact_span: int | None) -> str:
    """One document of at most ``n_tokens`` tokens (``count`` measures a text). ``fact_span``:
    ``None`` puts the fact at a uniform depth, else within the first ``fact_span`` tokens."""
    if kind == "passkey":
        return _passkey(rng, n_tokens, count, fact_span)
    if kind == "niah":
        return _niah(rng, n_tokens, count, fact_span)
    return _fact(rng, n_tokens, count)


def write_docs(path: str, *, num_docs: int, min_tokens: int, max_tokens: int, seed: int,
               count: Count, fact_span: int | None, kinds: tuple[str, ...] = KINDS,
               probs: tuple[float, ...] = KIND_PROBS) -> str:
    """``num_docs`` JSONL documents ``{"text", "kind"}`` of ``min..max`` tokens."""
    rng = random.Random(f"replication:{seed}")
    with atomic_path(path, fsync=False) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for _ in range(num_docs):
            kind = rng.choices(kinds, weights=probs)[0]
            n = rng.randint(min_tokens, max_tokens)
            f.write(json.dumps({"text": document(rng, kind, n, count, fact_span),
                                "kind": kind}) + "\n")
    return path


def make_tokenizer(workdir: str, *, vocab_size: int, num_docs: int = 600,
                   split_digits: bool = False) -> str:
    """A SentencePiece model (the repo's
    :func:`~megatron_endprompt.data.prepare.synthetic.train_sentencepiece`) trained on a short
    sample of every document kind; ``split_digits``: a digit per piece as in Llama-2's
    tokenizer, so a key is copied digit for digit (with merged digit groups the base missed a
    key's last group)."""
    rough = lambda text: max(1, len(text) // 3)  # noqa: E731 - characters per token, roughly
    sample = write_docs(os.path.join(workdir, "tokenizer_corpus.jsonl"), num_docs=num_docs,
                        min_tokens=60, max_tokens=300, seed=7, count=rough, fact_span=None)
    return synthetic.train_sentencepiece(sample, os.path.join(workdir, "tokenizer"),
                                         vocab_size=vocab_size, split_digits=split_digits)


def token_counter(spm_model: str) -> Count:
    """Exact token count of a text under the SentencePiece model (cached)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=spm_model)
    cache: dict[str, int] = {}

    def count(text: str) -> int:
        n = cache.get(text)
        if n is None:
            n = len(sp.encode(text))
            if len(text) < 400:
                cache[text] = n
        return n
    return count


def write_plain_prefix(jsonl: str, prefix: str, spm_model: str, *,
                       pad_to: int | None = None) -> int:
    """Megatron ``.bin/.idx`` without a sidecar (plain data: contiguous positions), tokenized
    by the same Megatron-Core tokenizer as preprocessing, EOD appended; returns its tokens.
    ``pad_to``: every document is filled up with EOD tokens to exactly this many tokens, so
    that Megatron's windows of ``seq_length`` (stride ``seq_length``) hold one document each."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer

    tok = build_tokenizer(TokenizerSpec(tokenizer_type="GPTSentencePieceTokenizer",
                                        tokenizer_model=spm_model))
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(tok.vocab_size))
    total = 0
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            ids = tok.tokenize(json.loads(line)["text"]) + [tok.eod]
            if pad_to is not None:
                if len(ids) > pad_to:
                    raise ValueError(f"{jsonl}: a document has {len(ids)} tokens with its EOD, "
                                     f"more than {pad_to}")
                ids += [tok.eod] * (pad_to - len(ids))
            builder.add_document(np.asarray(ids, dtype=np.int64), [len(ids)])
            total += len(ids)
    builder.finalize(prefix + ".idx")
    return total
