"""The tiktoken path (~5x less CPU per token than HF ``tokenizers``): ids equal HF ``tokenizers``
and Megatron's tokenizer on the stress set and fixtures for every convertible kind; each refused
kind falls back with its reason; the special-token-literal, regex-dialect and surrogate traps."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE, WordPiece
from tokenizers.trainers import BpeTrainer, WordPieceTrainer

from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.tokenize import encode
from megatron_endprompt.data.prepare.synthetic import LLAMA3_SPLIT_PATTERN
from megatron_endprompt.data.tokenize.tiktoken_bpe import convert, convert_pattern
from megatron_endprompt.data.tokenize.encoder_choice import choose_encoder
from megatron_endprompt.data.tokenize.tiktoken_encoder import STRESS_TEXTS, tiktoken_encoder

EXTRA = ["Numbers 1234567 and 12 345 678; YOU'LL see it's <|end_of_text|> x<|begin_of_text|>y",
         "line\r\n\r\n  indented\ttab  ", "caf\u00e9 cafe\u0301 \u65e5\u672c \U0001f642"]


def _texts(spm_corpus):
    return spm_corpus.texts[:40]


def _train(texts, *, pre, normalizer=None, specials=("<|begin_of_text|>", "<|end_of_text|>"),
           model="bpe"):
    if model == "wordpiece":
        tok = Tokenizer(WordPiece(unk_token="[UNK]"))
        trainer = WordPieceTrainer(vocab_size=300, special_tokens=["[UNK]"], show_progress=False)
    else:
        tok = Tokenizer(BPE())
        trainer = BpeTrainer(vocab_size=500, show_progress=False, special_tokens=[],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.pre_tokenizer = pre
    tok.normalizer = normalizer
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


def _gpt2(texts):
    return _train(texts, pre=pre_tokenizers.ByteLevel(add_prefix_space=False))


def _split(pattern):
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _same_ids(tok, texts):
    enc, why = tiktoken_encoder(tok, eod=None, workers=2)
    assert enc is not None, why
    ours = enc.encode(list(texts))
    for text, ids in zip(texts, ours):
        assert ids.tolist() == tok.encode(text).ids, text[:60]
    return enc


@pytest.mark.parametrize("kind", ["gpt2", "llama3"])
def test_ids_equal_hf_on_stress_set_and_fixture(kind, spm_corpus, llama3_tokenizer_dir):
    texts = _texts(spm_corpus)
    tok = _gpt2(texts) if kind == "gpt2" else Tokenizer.from_file(
        llama3_tokenizer_dir + "/tokenizer.json")
    _same_ids(tok, [*STRESS_TEXTS, *EXTRA, *texts])


def test_megatron_tokenizer_probe_chooses_tiktoken(llama3_tokenizer, spm_corpus):
    enc, path, why = choose_encoder(llama3_tokenizer, _texts(spm_corpus)[:8], append_eod=True,
                                    workers=2)
    assert path == "tiktoken", why
    ids = enc.encode(["hello world"])[0].tolist()
    assert ids == [*llama3_tokenizer.tokenize("hello world"), llama3_tokenizer.eod]


def test_special_token_literal_becomes_the_special_token(llama3_tokenizer_dir):
    """``allowed_special="all"`` semantics, as HF and Megatron: not ``encode_ordinary``."""
    tok = Tokenizer.from_file(llama3_tokenizer_dir + "/tokenizer.json")
    text = "the end<|end_of_text|>and more"
    enc = _same_ids(tok, [text])
    assert tok.token_to_id("<|end_of_text|>") in enc.encode([text])[0].tolist()
    ordinary = enc.encoding.encode_ordinary(text)
    assert ordinary != tok.encode(text, add_special_tokens=False).ids  # the trap is real


def test_regex_dialect_possessive_braces_rewritten(spm_corpus):
    """``\\p{N}{1,3}+`` is "repeated 1-3 digit groups" to HF's Oniguruma but possessive "at most
    3 digits" to tiktoken: converted to ``(?:\\p{N}{1,3})+``, ids equal HF."""
    pattern = LLAMA3_SPLIT_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}{1,3}+")
    tok = _train(_texts(spm_corpus), pre=_split(pattern))
    conv = convert(tok.to_str())
    assert conv.encoding is not None and "rewritten" in conv.reason
    digits = ["1234567 89 1234567890123 x12345678"]
    _same_ids(tok, [*digits, *STRESS_TEXTS])
    import tiktoken

    raw = tiktoken.Encoding("raw", pat_str=pattern, mergeable_ranks=conv.encoding._mergeable_ranks,
                            special_tokens={})
    assert raw.encode(digits[0]) != tok.encode(digits[0], add_special_tokens=False).ids


@pytest.mark.parametrize("pattern,words", [(r"^\s+|\w+", "line anchor"), (r"\h+|\w+", r"\h"),
                                           (r"(ab){1,2}+|\w+", "no simple atom")])
def test_regex_dialect_refused(pattern, words):
    converted, why = convert_pattern(pattern)
    assert converted is None and words in why


@pytest.mark.parametrize("kind,reason", [
    ("nfc", "normalizer NFC"), ("prefix_space", "add_prefix_space=True"),
    ("wordpiece", "model WordPiece"), ("metaspace", "pre-tokenizer Metaspace"),
    ("lstrip", "lstrip=True")])
def test_refused_kinds_fall_back_with_reason(kind, reason, spm_corpus):
    texts = _texts(spm_corpus)
    if kind == "nfc":
        tok = _train(texts, pre=pre_tokenizers.ByteLevel(add_prefix_space=False),
                     normalizer=normalizers.NFC())
    elif kind == "prefix_space":
        tok = _train(texts, pre=pre_tokenizers.ByteLevel(add_prefix_space=True))
    elif kind == "wordpiece":
        tok = _train(texts, pre=pre_tokenizers.Whitespace(), model="wordpiece")
    elif kind == "metaspace":  # SentencePiece-style BPE (Llama-2 / Mistral in HF form)
        tok = _train(texts, pre=pre_tokenizers.Metaspace())
    else:
        tok = _gpt2(texts)
        tok.add_special_tokens([AddedToken("<|x|>", special=True, lstrip=True)])
    enc, why = tiktoken_encoder(tok, eod=None, workers=1)
    assert enc is None and reason in why


def test_sentencepiece_megatron_tokenizer_uses_spm_batches_with_reason(spm_tokenizer,
                                                                       spm_corpus):
    enc, path, why = choose_encoder(spm_tokenizer, _texts(spm_corpus)[:4], append_eod=True,
                                    workers=1)
    assert enc is not None and path == "spm-batch" and "SentencePiece encode" in why


def test_long_document_chunked_same_ids(llama3_tokenizer_dir, monkeypatch):
    monkeypatch.setattr(encode, "_CHUNK_CHARS", 200)
    tok = Tokenizer.from_file(llama3_tokenizer_dir + "/tokenizer.json")
    rng = np.random.default_rng(0)
    words = ["the", "horse,", "12345", "\n", "  ", "x'll", "\t", "!!", "na\u00efve", "<|eot_id|>"]
    text = " ".join(rng.choice(words, 3000).tolist())
    _same_ids(tok, [text, "short"])


def test_lone_surrogate_refused_before_tiktoken(llama3_args, run_tool, tmp_path):
    """tiktoken would silently replace it; our check names the line first."""
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"text": "fine text here " * 20}) + "\n"
                    + '{"text": "bad \\ud800 half"}\n')
    rc, out, err = run_tool(preprocess_cli.main, llama3_args(
        tmp_path / "o", "--tokenizer-backend", "tiktoken", inputs=[str(path)]))
    assert rc == 2 and "s.jsonl:2: lone surrogate \\ud800" in err
    assert len(err.strip().splitlines()) == 1


def test_forced_tiktoken_refused_for_sentencepiece(spm_args, run_tool, tmp_path):
    rc, out, err = run_tool(preprocess_cli.main, spm_args(tmp_path / "o", "--tokenizer-backend",
                                                          "tiktoken"))
    assert rc == 2 and "--tokenizer-backend tiktoken: cannot be used" in err
    assert "SentencePiece encode of a batch" in err


def test_surrogate_check_runs_before_tiktoken(llama3_tokenizer_dir):
    """tiktoken's ``encode`` silently replaces a lone surrogate; our encoder refuses the text
    before any tiktoken call sees it (whichever tiktoken API it uses)."""
    tok = Tokenizer.from_file(llama3_tokenizer_dir + "/tokenizer.json")
    enc, _ = tiktoken_encoder(tok, eod=None, workers=1)
    assert enc.encoding.encode("a\ud800b") == enc.encoding.encode("a\ufffdb")  # the trap
    seen = []
    real = enc.encoding.encode_to_numpy
    enc.encoding.encode_to_numpy = lambda text, **kw: seen.append(text) or real(text, **kw)
    with pytest.raises(ValueError, match="lone surrogate"):
        enc.encode(["fine", "a\ud800b"])
    assert seen == []


@pytest.mark.parametrize("edit,reason", [("swap", "merge order differs from id order"),
                                         ("dropout", "BPE dropout=0.1"),
                                         ("byte_fallback", "BPE byte_fallback=True")])
def test_bpe_model_quirks_refused(edit, reason, spm_corpus):
    spec = json.loads(_gpt2(_texts(spm_corpus)).to_str())
    model = spec["model"]
    if edit == "swap":  # the tokens of the first and last merges trade ids
        first, last = ("".join(m.split(" ") if isinstance(m, str) else m)
                       for m in (model["merges"][0], model["merges"][-1]))
        model["vocab"][first], model["vocab"][last] = model["vocab"][last], model["vocab"][first]
    else:
        model[edit] = 0.1 if edit == "dropout" else True
    conv = convert(json.dumps(spec))
    assert conv.encoding is None and reason in conv.reason
