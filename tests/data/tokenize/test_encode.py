"""The Rust batch tokenizer path (HF ``tokenizers``, batched across threads): same ids as Megatron's
HuggingFaceTokenizer, long documents chunked with bounded memory, Megatron flag parity."""

from __future__ import annotations

import numpy as np
import pytest

from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.tokenize import encode
from megatron_endprompt.data.sidecar.sidecar import read_sidecar
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer
from megatron_endprompt.errors import run_cli
from tests.support.gpt2_files import gpt2_vocab_and_merges


@pytest.fixture(scope="module")
def hf_dir(spm_corpus, tmp_path_factory):
    """A Llama-3-like HF tokenizer directory: byte-level BPE (Llama-3's split regex), BOS
    added by the post-processor, ``<|end_of_text|>`` as EOS."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
               r"| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    tok.train_from_iterator(spm_corpus.texts, trainer=trainers.BpeTrainer(
        vocab_size=600, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = tok.token_to_id(specials[0])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{specials[0]} $A", pair=f"{specials[0]} $A {specials[0]} $B",
        special_tokens=[(specials[0], bos)])
    path = tmp_path_factory.mktemp("hf") / "llama3_like"
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=specials[0],
                            eos_token=specials[1]).save_pretrained(str(path))
    return str(path)


@pytest.fixture(scope="module")
def hf_tok(hf_dir):
    return build_tokenizer(TokenizerSpec(tokenizer_type="HuggingFaceTokenizer",
                                         tokenizer_model=hf_dir))


def _argv(spm_args, prefix, hf_dir, *extra):
    return spm_args(prefix, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                    hf_dir, *extra)


def _files(prefix):
    return {s: open(str(prefix) + s, "rb").read() for s in (".bin", ".idx", ".endprompt")}


def test_fast_path_equals_megatron_tokenizer(spm_args, hf_dir, tmp_path, monkeypatch):
    calls = []
    original = encode.FastEncoder.encode
    monkeypatch.setattr(encode.FastEncoder, "encode",
                        lambda self, texts: calls.append(len(texts)) or original(self, texts))
    assert run_cli(preprocess_cli.main, _argv(spm_args, tmp_path / "fast", hf_dir,
                                              "--workers", 2, "--tokenizer-backend", "hf")) == 0
    assert sum(calls) > 40  # the probe plus every document went through encode_batch
    monkeypatch.setattr(encode, "fast_backend", lambda tok: None)  # Megatron's tokenize()
    assert run_cli(preprocess_cli.main, _argv(spm_args, tmp_path / "slow", hf_dir)) == 0
    fast, slow = _files(tmp_path / "fast"), _files(tmp_path / "slow")
    assert fast[".bin"] == slow[".bin"] and fast[".idx"] == slow[".idx"]
    a, b = (read_sidecar(str(tmp_path / n) + ".endprompt") for n in ("fast", "slow"))
    assert np.array_equal(a.records, b.records) and np.array_equal(a.sources, b.sources)
    assert (a.header.stats.pop("tokenizer_path"), b.header.stats.pop("tokenizer_path")) \
        == ("rust-batch", "per-document")
    a.header.stats.pop("tokenizer_path_reason"), b.header.stats.pop("tokenizer_path_reason")
    assert a.header.stats == b.header.stats


def test_long_document_is_chunked_with_same_ids(hf_tok, monkeypatch):
    """A document longer than the chunk size never reaches encode_batch whole (memory stays
    bounded for a 63 MB line) and gives exactly Megatron's ids."""
    monkeypatch.setattr(encode, "_CHUNK_CHARS", 200)
    rng = np.random.default_rng(0)
    words = ["the", "grey", "horse,", "crosses", "été", "12345", "bridge.", "\n", "  ", "x'll",
             "\t", "!!", "naïve"]
    text = " ".join(rng.choice(words, 3000).tolist())
    backend = encode.fast_backend(hf_tok)
    assert backend is not None
    encoder = encode.FastEncoder(backend, eod=hf_tok.eod)
    assert encoder.chunkable and encoder.prefix  # BOS comes from the post-processor
    seen = []
    real = backend.encode_batch

    class Spy:
        def __getattr__(self, name):
            return getattr(backend, name)

        def encode_batch(self, texts, **kw):
            seen.extend(map(len, texts))
            return real(texts, **kw)

        encode_batch_fast = encode_batch

    encoder.backend = Spy()
    ids = encoder.encode([text, "short one"])
    assert ids[0].tolist() == [*hf_tok.tokenize(text), hf_tok.eod]
    assert ids[1].tolist() == [*hf_tok.tokenize("short one"), hf_tok.eod]
    assert len(seen) > 50 and max(seen) < 400 < len(text)


def test_split_sentences_refused_with_reason(spm_args, run_tool, tmp_path):
    rc, _, err = run_tool(preprocess_cli.main, spm_args(tmp_path / "x", "--split-sentences"))
    assert rc == 2 and err.count("\n") == 1 and "terminals" in err
    assert not list(tmp_path.iterdir())


def test_gpt2_vocab_and_merges_wrapped_as_hf_in_one_line(spm_args, spm_corpus, run_tool,
                                                         tmp_path):
    """GPT-2's vocab.json/merges.txt, given as GPT2BPETokenizer files or as an
    HF directory holding only them, are wrapped as an HF tokenizer beside the output (one
    line names it); both give the same bytes, EOD is <|endoftext|>."""
    import json
    import os

    import numpy as np

    vocab, merges = gpt2_vocab_and_merges(spm_corpus.texts, tmp_path / "gpt2", vocab_size=400)
    out = tmp_path / "out"
    out.mkdir()
    rc, _, err = run_tool(preprocess_cli.main, spm_args(
        out / "a", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab,
        "--merge-file", merges))
    assert rc == 0, err
    line = [x for x in err.splitlines() if "wrapped as a Hugging Face tokenizer" in x]
    assert len(line) == 1
    (wrapped,) = [p for p in os.listdir(out) if p.startswith("gpt2-hf-")]
    assert str(out / wrapped) in line[0]
    rc, _, err = run_tool(preprocess_cli.main, spm_args(
        out / "b", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
        tmp_path / "gpt2"))
    assert rc == 0, err
    assert os.listdir(out).count(wrapped) == 1 and len(
        [p for p in os.listdir(out) if p.startswith("gpt2-hf-")]) == 1  # reused, not rewritten
    for s in (".bin", ".idx"):
        assert (out / f"a{s}").read_bytes() == (out / f"b{s}").read_bytes()
    from megatron_endprompt.data.sidecar.indexed_io import IndexReader

    with open(vocab) as f:
        eot = json.load(f)["<|endoftext|>"]
    reader = IndexReader(str(out / "a.idx"))
    data = np.fromfile(out / "a.bin", dtype=reader.dtype)
    ends = np.cumsum(reader.sequence_lengths) - 1
    assert (data[ends] == eot).all()


def test_gpt2bpe_without_files_or_malformed_refused_in_one_line(spm_args, run_tool, tmp_path):
    rc, _, err = run_tool(preprocess_cli.main, spm_args(
        tmp_path / "x", "--tokenizer-type", "GPT2BPETokenizer"))
    assert rc == 2 and err.count("\n") == 1 and "--vocab-file" in err
    vocab, merges = tmp_path / "vocab.json", tmp_path / "merges.txt"
    vocab.write_text("{}")
    merges.write_text("#version: 0.2\n")
    rc, _, err = run_tool(preprocess_cli.main, spm_args(
        tmp_path / "x", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab,
        "--merge-file", merges))
    assert rc == 2 and err.count("\n") == 1 and "GPT-2 tokenizer" in err
    assert not list(tmp_path.glob("x*")) and not list(tmp_path.glob("gpt2-hf-*"))


def test_megatron_flags_accepted_and_log_lines(spm_args, run_tool, tmp_path):
    """--keep-newlines and --log-interval are accepted; without a terminal, progress is plain
    lines (no carriage return) with bytes done of the total, ending at 100%."""
    argv = [a for a in spm_args(tmp_path / "x", "--keep-newlines", "--log-interval", 10)
            if a != "--no-progress"]
    rc, out, err = run_tool(preprocess_cli.main, argv)
    assert rc == 0, err
    lines = [x for x in err.splitlines() if x.startswith("progress:")]
    assert lines and "\r" not in err
    assert " MiB (100.0%)" in lines[-1] and "tokens/s" in lines[-1]
