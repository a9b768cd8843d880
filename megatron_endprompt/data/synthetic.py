"""Generated text and a SentencePiece tokenizer trained on it: the embedded default data of
the quick start, the tests and the benchmarks (no download needed).

Documents are sentences from a small grammar; each document states a fact early ("The pass
key of <name> is <number>.") and repeats it at its end, so a model can only predict the end
from the beginning — a long-range dependency that EndPrompt's terminal anchoring targets.
"""

from __future__ import annotations

import json
import os

import numpy as np

_SUBJECTS = ["the river", "a merchant", "the old king", "my sister", "the north wind",
             "a young clerk", "the garden", "our captain", "the quiet town", "a grey horse"]
_VERBS = ["remembers", "carries", "watches", "follows", "praises", "forgets", "finds",
          "answers", "builds", "crosses"]
_OBJECTS = ["the bridge", "a letter", "the harbour", "seven candles", "the long road",
            "an iron key", "the market", "a silver cup", "the winter field", "the tower"]
_TAILS = ["at dawn", "before the rain", "with great care", "in silence", "every evening",
          "without a word", "for the last time", "near the sea", "after supper", "once more"]
NAMES = ["Alder", "Brisk", "Cobalt", "Dune", "Ember", "Fennel", "Garnet", "Heron"]


def sentence(rng: np.random.Generator) -> str:
    """One grammatical sentence."""
    s = " ".join(str(rng.choice(w)) for w in (_SUBJECTS, _VERBS, _OBJECTS, _TAILS))
    return s[0].upper() + s[1:] + "."


def document(rng: np.random.Generator, n_sentences: int) -> str:
    """A document with a fact stated at the start and recalled at the end."""
    name, key = str(rng.choice(NAMES)), int(rng.integers(10000, 99999))
    body = " ".join(sentence(rng) for _ in range(n_sentences))
    return f"The pass key of {name} is {key}. {body} The pass key of {name} was {key}."


def write_corpus(path: str, *, num_docs: int, seed: int = 0,
                 min_sentences: int = 2, max_sentences: int = 120) -> str:
    """Write ``num_docs`` JSONL documents ``{"text": ...}`` of varied length to ``path``."""
    rng = np.random.default_rng(seed)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for _ in range(num_docs):
            n = int(rng.integers(min_sentences, max_sentences + 1))
            f.write(json.dumps({"text": document(rng, n)}) + "\n")
    os.replace(tmp, path)
    return path


def train_sentencepiece(corpus_jsonl: str, model_prefix: str, *, vocab_size: int = 512) -> str:
    """Train a small BPE SentencePiece model on the corpus; returns ``PREFIX.model``."""
    import sentencepiece as spm

    from megatron_endprompt.data.prompts import BUILTIN_PROMPTS

    def texts():
        yield from BUILTIN_PROMPTS  # so the built-in terminal prompts tokenize cleanly
        with open(corpus_jsonl, encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)["text"]

    spm.SentencePieceTrainer.train(
        sentence_iterator=texts(), model_prefix=model_prefix, vocab_size=vocab_size,
        model_type="bpe", bos_id=-1, eos_id=1, unk_id=0, pad_id=-1, minloglevel=2,
        max_sentence_length=1 << 16, num_threads=1, character_coverage=1.0,
        byte_fallback=True,
    )
    return model_prefix + ".model"
