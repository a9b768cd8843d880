"""A trained byte-level BPE whose vocabulary lacks some single bytes: tiktoken for every document
the vocabulary covers, HF ``tokenizers`` for the ones holding a missing byte (HF drops it,
tiktoken cannot encode it); ids equal HF's on every document, ``.bin/.idx`` equal Megatron's,
and the path line says why and how many documents took the HF path."""

from __future__ import annotations

import json

import pytest

from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.tokenize.tiktoken_bpe import convert, missing_byte_finder
from megatron_endprompt.data.tokenize.tiktoken_encoder import STRESS_TEXTS, tiktoken_encoder
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer
from tests.support.layout import SPM_B, SPM_L, SPM_P
from tests.support.megatron_preprocess import megatron_preprocess, same_bin_idx

#: Dropped from the trainer's alphabet: control bytes, a UTF-8 continuation byte (0xA9: é, ©),
#: a lead byte (0xE6: 日, 本) and the bytes UTF-8 never uses.
DROPPED = (0x00, 0x01, 0x1B, 0xA9, 0xC0, 0xC1, 0xE6, *range(0xF5, 0x100))
WITH_MISSING = ["bell \x01 in the text", "caf\u00e9 au lait", "\u65e5\u672c\u8a9e text",
                "escape \x1b[0m codes", "copyright \u00a9 2026"]
CLEAN = ["na\u00efve \u00fcber \u00c5ngstr\u00f6m", "plain words, 12345 and more",
         "emoji \U0001f642 and \u0915\u094d\u0937"]


@pytest.fixture(scope="module")
def tok_dir(spm_corpus, tmp_path_factory):
    """A GPT-2-style byte-level BPE trained offline on the session corpus, its initial alphabet
    the 256 bytes minus :data:`DROPPED` (none of which the corpus holds)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from megatron_endprompt.data.tokenize.tiktoken_bpe import _unicode_to_byte

    byte_of = _unicode_to_byte()
    alphabet = [ch for ch in pre_tokenizers.ByteLevel.alphabet() if byte_of[ch] not in DROPPED]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    eot = "<|endoftext|>"
    tok.train_from_iterator([*spm_corpus.texts, *CLEAN], trainer=trainers.BpeTrainer(
        vocab_size=600, special_tokens=[eot], show_progress=False, initial_alphabet=alphabet))
    path = tmp_path_factory.mktemp("missing_bytes") / "bpe"
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eot, eos_token=eot,
                            unk_token=eot).save_pretrained(str(path))
    return str(path)


@pytest.fixture(scope="module")
def corpus(spm_corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("missing_bytes_corpus") / "c.jsonl"
    texts = [*spm_corpus.texts[:15], *WITH_MISSING, *CLEAN, *spm_corpus.texts[15:]]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return str(path)


def _backend(tok_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(tok_dir + "/tokenizer.json")


def test_conversion_lists_the_missing_bytes(tok_dir):
    conv = convert(_backend(tok_dir).to_str())
    assert conv.encoding is not None and conv.missing_bytes == DROPPED
    assert f"lacks {len(DROPPED)} of the 256 single bytes (0x00-0x01, 0x1b, 0xa9, 0xc0-0xc1, " \
           "0xe6, 0xf5-0xff)" in conv.reason


def test_finder_agrees_with_the_utf8_bytes():
    holds = missing_byte_finder(DROPPED)
    for text in [*WITH_MISSING, *CLEAN, *STRESS_TEXTS, "\u0800\u07ff\U00010000\u6000"]:
        assert holds(text) == any(b in DROPPED for b in text.encode("utf-8")), text


def test_ids_equal_hf_on_every_document(tok_dir, spm_corpus):
    backend = _backend(tok_dir)
    enc, why = tiktoken_encoder(backend, eod=None, workers=2)
    assert enc is not None, why
    texts = [*WITH_MISSING, *CLEAN, *STRESS_TEXTS, *spm_corpus.texts]
    for text, ids in zip(texts, enc.encode(texts)):
        assert ids.tolist() == backend.encode(text).ids, text[:40]
    holding = sum(any(b in DROPPED for b in t.encode("utf-8")) for t in texts)
    assert enc.slow_docs == holding >= len(WITH_MISSING)


def test_tool_uses_tiktoken_and_writes_megatrons_bin_idx(tok_dir, corpus, run_tool, tmp_path):
    tokenizer = build_tokenizer(TokenizerSpec(tokenizer_type="HuggingFaceTokenizer",
                                              tokenizer_model=tok_dir))
    ref = megatron_preprocess(corpus, str(tmp_path / "megatron"), tokenizer, append_eod=True)
    n_docs = sum(1 for _ in open(corpus, encoding="utf-8"))
    for run in ("cold", "warm"):  # Megatron's tokenizer, then the cached verdict's stand-in
        prefix = tmp_path / run
        rc, out, err = run_tool(preprocess_cli.main, [
            "--input", corpus, "--output-prefix", str(prefix), "--tokenizer-type",
            "HuggingFaceTokenizer", "--tokenizer-model", tok_dir, "--seq-length", str(SPM_P),
            "--target-length", str(SPM_L), "--terminal-length", str(SPM_B), "--append-eod",
            "--no-progress", "--workers", "2"])
        assert rc == 0, err
        line = next(x for x in out.splitlines() if x.startswith("tokenizer path:"))
        assert line.startswith("tokenizer path: tiktoken (byte-level BPE"), line
        assert f"the vocabulary lacks {len(DROPPED)} of the 256 single bytes" in line
        assert line.endswith(f"; {len(WITH_MISSING)} of {n_docs} documents held a byte the "
                             "vocabulary lacks and took the HF tokenizers path"), line
        assert same_bin_idx(str(prefix), ref), run
