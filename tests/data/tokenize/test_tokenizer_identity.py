"""Tokenizer identity recorded in sidecars (data made with another tokenizer must not train):
same vocabulary -> same identity, any other vocabulary (even of the same size) -> a different
one. Built with Megatron's builder, as preprocessing and training do."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from megatron_endprompt.compat import build_megatron_tokenizer
from megatron_endprompt.data.tokenize.tokenizer_identity import (
    TokenizerIdentity,
    id_to_token_table,
    tokenizer_identity,
)


def same_tokenizer(recorded, current) -> bool:
    """The one matching rule, read off the class."""
    return recorded.matches(current)


def _hf_dir(path, swap: bool = False) -> str:
    """A tiny Llama-like HF tokenizer directory; ``swap`` exchanges the ids of two tokens
    (a different vocabulary of the same size)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["this is the end of text please pay attention here"] * 4,
                            trainers.BpeTrainer(vocab_size=60, show_progress=False,
                                                special_tokens=["<unk>", "<|begin_of_text|>",
                                                                "<|end_of_text|>"]))
    if swap:
        spec = json.loads(tok.to_str())
        vocab = spec["model"]["vocab"]
        a, b = sorted(vocab, key=vocab.get)[5:7]
        vocab[a], vocab[b] = vocab[b], vocab[a]
        tok = Tokenizer.from_str(json.dumps(spec))
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                            eos_token="<|end_of_text|>", unk_token="<unk>").save_pretrained(path)
    return str(path)


def _identity(kind, model=None, vocab=None):
    return tokenizer_identity(build_megatron_tokenizer(kind, model, vocab), tokenizer_type=kind,
                              tokenizer_model=model)


def test_hf_identity_follows_the_vocabulary_not_the_path(tmp_path):
    a = _identity("HuggingFaceTokenizer", _hf_dir(tmp_path / "a"))
    copy = str(tmp_path / "copy")
    shutil.copytree(tmp_path / "a", copy)
    b = _identity("HuggingFaceTokenizer", copy)
    swapped = _identity("HuggingFaceTokenizer", _hf_dir(tmp_path / "s", swap=True))
    assert a.eod == 2 and a.vocab_size == swapped.vocab_size
    assert same_tokenizer(a, b)
    assert a.fingerprint != swapped.fingerprint and not same_tokenizer(a, swapped)


def test_sentencepiece_and_null_identities(spm_corpus, tmp_path):
    table = id_to_token_table(build_megatron_tokenizer("GPTSentencePieceTokenizer",
                                                       spm_corpus.model))
    assert table and all(isinstance(t, str) for t in table)
    copy = tmp_path / "copy.model"
    shutil.copyfile(spm_corpus.model, copy)
    assert same_tokenizer(_identity("GPTSentencePieceTokenizer", spm_corpus.model),
                          _identity("GPTSentencePieceTokenizer", str(copy)))
    null = _identity("NullTokenizer", vocab=1000)
    assert same_tokenizer(null, _identity("NullTokenizer", vocab=1000))
    assert not same_tokenizer(null, _identity("NullTokenizer", vocab=1001))


@pytest.mark.parametrize("key", ["vocab_size", "eod", "fingerprint"])
def test_any_difference_is_a_different_tokenizer(key):
    a = {"vocab_size": 10, "eod": 2, "fingerprint": "0" * 64}
    ident = TokenizerIdentity.from_dict
    assert same_tokenizer(ident(a), ident(dict(a))) and \
        not same_tokenizer(ident(a), ident({**a, key: 3}))


def test_without_fingerprint_only_size_and_eod_are_compared():
    """Ranks other than rank 0 skip the fingerprint (same flags build the same tokenizer)."""
    tok = build_megatron_tokenizer("NullTokenizer", None, 1000)
    cheap = tokenizer_identity(tok, fingerprint=False)
    assert cheap.fingerprint is None
    recorded = tokenizer_identity(tok)
    assert same_tokenizer(recorded, cheap)
    assert not same_tokenizer(recorded, dataclasses.replace(cheap, vocab_size=1001))


def test_on_disk_form_round_trips_and_old_headers_read():
    """``as_dict`` is the header's form, keys in the order sidecars have always written them;
    an old header (or a verdict entry with the id fields only) reads back."""
    tok = build_megatron_tokenizer("NullTokenizer", None, 1000)
    ident = tokenizer_identity(tok, tokenizer_type="NullTokenizer")
    assert list(ident.as_dict()) == ["tokenizer_type", "tokenizer_model", "vocab_size", "eod",
                                     "fingerprint"]
    assert TokenizerIdentity.from_dict(ident.as_dict()) == ident
    assert TokenizerIdentity.from_dict({}) is None
    part = TokenizerIdentity.from_dict(ident.ids_part())
    assert part.matches(ident) and part.tokenizer_type is None
