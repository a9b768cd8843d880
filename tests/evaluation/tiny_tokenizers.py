"""Helpers the evaluation tests share: where the made-up benchmark fixtures are, and small HF
tokenizers trained inside the session (byte-level BPE as Llama 3 / GPT-2, Metaspace BPE as
SentencePiece Llama 2). No download."""

from __future__ import annotations

import os

import numpy as np

from megatron_endprompt.evaluation.passkey import legacy as tasks

#: ``tests/evaluation/fixtures/``: LongBench's JSONL, RULER's SQuAD/HotpotQA JSON, the short-text
#: benchmarks' JSONL (made-up items in each benchmark's format).
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def _training_text() -> list[str]:
    """Every piece the prompts use, plus numbers, so the tokenizers learn merges for them."""
    rng = np.random.default_rng(0)
    lines = [tasks.PASSKEY_INTRO, tasks.PASSKEY_FILLER, tasks.PASSKEY_QUESTION,
             tasks.NIAH_INTRO, tasks.NIAH_QUESTION, *tasks._essay_pool()[:200]]
    for i in range(200):
        lines.append(tasks.passkey_needle(int(rng.integers(1, 50001))))
        key = f"{tasks._ADJECTIVES[i % 27]}-{tasks._NOUNS[i % 24]}"
        lines.append(tasks.niah_needle(key, str(int(rng.integers(1_000_000, 9_999_999)))))
    return lines


def build_tokenizer(kind: str, *, extra_text: tuple[str, ...] = (), vocab_size: int = 400):
    """A ``PreTrainedTokenizerFast`` (BPE, ``vocab_size`` tokens) of flavour ``bytelevel`` or
    ``metaspace``, with ``<s>``/``</s>`` (BOS added, as Llama) and ``<pad>``, trained on the
    legacy prompts plus ``extra_text``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    if kind == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        alphabet = []
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(_training_text() + list(extra_text) + ["\n"], trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>")
