"""The SentencePiece batch path: Megatron's exact ids and ``.bin/.idx`` for
``SentencePieceTokenizer``, ``GPTSentencePieceTokenizer`` and ``Llama2Tokenizer``, with and
without ``--append-eod``, special-token strings, whitespace runs, byte fallback and long lines
cut at spaces; the path line names the path; an unsafe wrapper keeps the per-document pool."""

from __future__ import annotations

import json

import numpy as np
import pytest

from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.tokenize import encode
from megatron_endprompt.data.tokenize.spm_encoder import (SpmEncoder, cut_safe, spm_processor)
from megatron_endprompt.data.tokenize.encoder_choice import choose_encoder
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer
from tests.support.layout import SPM_B, SPM_L, SPM_P
from tests.support.megatron_preprocess import megatron_preprocess, same_bin_idx

TYPES = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")
TRICKY = ["<s> starts </s> ends <unk> and <pad> [INST] x [/INST] <0x41>",
          "  two leading,  double   spaces and trailing  ",
          "\u2581separator chars\u2581\u2581 typed in",
          "tabs\tnew\nlines\r\n\n\nthe end",
          "caf\u00e9 \u65e5\u672c\u8a9e \U0001f642 \u0915\u094d\u0937 na\u00efve (byte fallback)"]


@pytest.fixture(scope="module")
def models(spm_corpus, tmp_path_factory):
    """The session's SentencePiece BPE (dummy prefix, extra whitespace removed) and a
    Llama-2-like one (whitespace kept, whitespace-only pieces, digits split)."""
    from megatron_endprompt.data.prepare.synthetic import build_llama2_like_tokenizer

    root = tmp_path_factory.mktemp("spm_models")
    llama2 = build_llama2_like_tokenizer(spm_corpus.path, str(root / "llama2"))
    return {"spm": spm_corpus.model, "llama2": llama2 + "/tokenizer.model"}


@pytest.fixture(scope="module")
def corpus(spm_corpus, tmp_path_factory):
    """The session corpus plus tricky documents and one long line (many chunks once
    ``_CHUNK_CHARS`` is lowered)."""
    rng = np.random.default_rng(0)
    words = ["the", "horse,", "12345", "  ", "x'll", "\t", "!!", "na\u00efve", "<s>", "\n"]
    long = " ".join(rng.choice(words, 4000).tolist())
    path = tmp_path_factory.mktemp("spm_batch") / "corpus.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for text in [*spm_corpus.texts[:20], *TRICKY, long, *spm_corpus.texts[20:]]:
            f.write(json.dumps({"text": text}) + "\n")
    return str(path)


def _argv(corpus, prefix, tok_type, model, *extra):
    return ["--input", corpus, "--output-prefix", str(prefix), "--tokenizer-type", tok_type,
            "--tokenizer-model", model, "--seq-length", str(SPM_P), "--target-length",
            str(SPM_L), "--terminal-length", str(SPM_B), "--no-progress", "--workers", "2",
            *map(str, extra)]


@pytest.mark.parametrize("which", ["spm", "llama2"])
@pytest.mark.parametrize("tok_type", TYPES)
@pytest.mark.parametrize("append_eod", [True, False])
def test_batch_path_writes_megatrons_bin_idx(which, tok_type, append_eod, models, corpus,
                                             run_tool, tmp_path, monkeypatch):
    monkeypatch.setattr(encode, "_CHUNK_CHARS", 300)  # the long line is cut in ~90 chunks
    model = models[which]
    extra = ["--append-eod"] if append_eod else []
    rc, out, err = run_tool(preprocess_cli.main,
                            _argv(corpus, tmp_path / "ours", tok_type, model, *extra))
    assert rc == 0, err
    assert "tokenizer path: SentencePiece (C++ batches) (SentencePiece encode of a batch on " \
           "--workers C++ threads; ids equal Megatron's" in out
    assert "long lines cut at spaces" in out
    assert "cold run); sentencepiece alone matched it" in out
    tokenizer = build_tokenizer(TokenizerSpec(tokenizer_type=tok_type, tokenizer_model=model))
    ref = megatron_preprocess(corpus, str(tmp_path / "megatron"), tokenizer,
                              append_eod=append_eod)
    assert same_bin_idx(str(tmp_path / "ours"), ref)
    # warm: the cached verdict's sentencepiece-only stand-in, same bytes
    rc, out, err = run_tool(preprocess_cli.main,
                            _argv(corpus, tmp_path / "warm", tok_type, model, *extra))
    assert rc == 0 and "model read by sentencepiece alone, no torch/Megatron import" in out, err
    assert same_bin_idx(str(tmp_path / "warm"), ref)


@pytest.mark.parametrize("which", ["spm", "llama2"])
def test_long_text_cut_at_spaces_same_ids(which, models, monkeypatch):
    monkeypatch.setattr(encode, "_CHUNK_CHARS", 100)
    tokenizer = build_tokenizer(TokenizerSpec(tokenizer_type="Llama2Tokenizer",
                                              tokenizer_model=models[which]))
    proc, _ = spm_processor(tokenizer)
    assert cut_safe(proc)
    rng = np.random.default_rng(1)
    words = ["a", "bb,", "123", "   ", "\u00e9t\u00e9", "\n\n", "<s>", "x.", "\u2581"]
    texts = [" ".join(rng.choice(words, 2000).tolist()) for _ in range(3)] + TRICKY
    enc = SpmEncoder(proc, eod=tokenizer.eod, workers=2, chunkable=True)
    for text, ids in zip(texts, enc.encode(texts)):
        assert ids.tolist() == [*tokenizer.tokenize(text), tokenizer.eod]


def test_verdict_refused_when_ids_differ(models):
    """A wrapper whose ids differ from the plain processor's is never stood in for."""
    from megatron_endprompt.data.tokenize.spm_encoder import SpmTokenizer
    from megatron_endprompt.data.tokenize.tokenizer_verdict import compare_spm

    tokenizer = build_tokenizer(TokenizerSpec(tokenizer_type="Llama2Tokenizer",
                                              tokenizer_model=models["spm"]))
    assert compare_spm(SpmTokenizer(models["spm"]), tokenizer) is None
    assert "differs from Megatron's" in compare_spm(SpmTokenizer(models["llama2"]), tokenizer)
    light = SpmTokenizer(models["spm"])
    light.tokenize = lambda text: [1, 2]  # a stand-in with other ids
    assert compare_spm(light, tokenizer).startswith("ids differ from Megatron's")


def test_legacy_wrapper_with_special_tokens_keeps_the_pool(models, spm_corpus):
    """Megatron's legacy wrapper matches added special tokens in Python: no batch path."""
    from megatron.core.tokenizers.text.libraries.sentencepiece_tokenizer import \
        SentencePieceTokenizer

    legacy = SentencePieceTokenizer(models["spm"], legacy=True, special_tokens=["<extra_0>"])
    proc, why = spm_processor(legacy)
    assert proc is None and "legacy" in why


def test_probe_picks_spm_batch(models, spm_corpus):
    tokenizer = build_tokenizer(TokenizerSpec(tokenizer_type="GPTSentencePieceTokenizer",
                                              tokenizer_model=models["spm"]))
    enc, path, why = choose_encoder(tokenizer, spm_corpus.texts[:8], append_eod=True, workers=2)
    assert path == "spm-batch" and isinstance(enc, SpmEncoder), why
