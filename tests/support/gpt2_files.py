"""GPT-2's on-disk tokenizer form, trained offline for the tests that feed ``preprocess`` a
``GPT2BPETokenizer`` (``--vocab-file`` + ``--merge-file``) rather than an HF directory."""

from __future__ import annotations

import json
import os

from tokenizers import Tokenizer, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

__all__ = ["gpt2_vocab_and_merges"]


def gpt2_vocab_and_merges(texts: list[str], out_dir: str | os.PathLike, *,
                          vocab_size: int = 400) -> tuple[str, str]:
    """``(vocab.json, merges.txt)`` of a byte-level BPE of ``vocab_size`` trained on ``texts``,
    with ``<|endoftext|>`` added last as GPT-2 has it, written into the new ``out_dir``."""
    os.makedirs(out_dir)
    tok = Tokenizer(BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(texts, trainer=BpeTrainer(
        vocab_size=vocab_size, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    vocab_path, merges_path = tok.model.save(os.fspath(out_dir))
    with open(vocab_path) as f:
        vocab = json.load(f)
    vocab["<|endoftext|>"] = len(vocab)
    with open(vocab_path, "w") as f:
        json.dump(vocab, f)
    return vocab_path, merges_path
