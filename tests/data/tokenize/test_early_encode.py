"""Start-up overlap of the Rust path (tokenizing while Megatron imports): documents tokenized from
``tokenizer.json`` while Megatron imports are kept only when that file is exactly Megatron's
tokenizer; the output never differs from Megatron's per-document ids."""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest

from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.tokenize import early_encode, encode
from megatron_endprompt.data.tokenize.read_input import input_range, read_lines
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec
from megatron_endprompt.errors import run_cli


@pytest.fixture
def adoptions(monkeypatch):
    """Results of every ``EarlyEncoding.adopt`` call: True when the early work was kept."""
    seen: list[bool] = []
    real = early_encode.EarlyEncoding.adopt

    def spy(self, *a, **k):
        out = real(self, *a, **k)
        seen.append(out is not None)
        return out

    monkeypatch.setattr(early_encode.EarlyEncoding, "adopt", spy)
    return seen


def _bin_idx(prefix) -> tuple[bytes, bytes]:
    return tuple(open(f"{prefix}{s}", "rb").read() for s in (".bin", ".idx"))


def _per_document(llama3_args, prefix, monkeypatch, *extra):
    with monkeypatch.context() as m:
        m.setattr(encode, "fast_backend", lambda tok: None)  # Megatron's own tokenize()
        assert run_cli(preprocess_cli.main, llama3_args(prefix, *extra)) == 0
    return _bin_idx(prefix)


def test_early_documents_kept_and_equal_megatron(llama3_args, tmp_path, adoptions,
                                                 monkeypatch):
    """Llama-3-like fixture: the early work is adopted (tokenizer.json is Megatron's tokenizer)
    and the .bin/.idx are the per-document path's bytes, EOD filled in afterwards."""
    assert run_cli(preprocess_cli.main, llama3_args(tmp_path / "early", "--workers", 2)) == 0
    assert adoptions == [True]
    assert _bin_idx(tmp_path / "early") == _per_document(llama3_args, tmp_path / "slow",
                                                         monkeypatch)


def test_early_work_dropped_when_transformers_changes_the_tokenizer(
        llama3_tokenizer_dir, llama3_args, spm_corpus, tmp_path, adoptions, monkeypatch):
    """A ``tokenizer_config.json`` special token that ``tokenizer.json`` lacks: transformers
    adds it to Megatron's backend, so the file's ids differ on text that contains it; the early
    work must be dropped and the output must be Megatron's."""
    tok_dir = tmp_path / "tok"
    shutil.copytree(llama3_tokenizer_dir, tok_dir)
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    config["additional_special_tokens"] = ["<|extra|>"]
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config))
    data = tmp_path / "extra.jsonl"
    data.write_text("".join(json.dumps({"text": f"{t} <|extra|> {t}"}) + "\n"
                            for t in spm_corpus.texts))
    args = lambda prefix: [*llama3_args(prefix, inputs=[str(data)]),  # noqa: E731
                           "--tokenizer-model", str(tok_dir)]
    assert run_cli(preprocess_cli.main, args(tmp_path / "early")) == 0
    assert adoptions == [False]
    with monkeypatch.context() as m:
        m.setattr(encode, "fast_backend", lambda tok: None)
        assert run_cli(preprocess_cli.main, args(tmp_path / "slow")) == 0
    assert _bin_idx(tmp_path / "early") == _bin_idx(tmp_path / "slow")


def test_bad_line_reported_in_order_through_early_path(llama3_args, spm_corpus, tmp_path,
                                                       run_tool, adoptions):
    lines = open(spm_corpus.path, encoding="utf-8").read().splitlines(keepends=True)
    data = tmp_path / "bad.jsonl"
    data.write_text("".join(lines[:30]) + "{not json\n" + "".join(lines[30:]))
    rc, _, err = run_tool(preprocess_cli.main, llama3_args(tmp_path / "x", inputs=[str(data)]))
    assert rc == 2 and err.count("\n") == 1 and "bad.jsonl:31" in err, err
    assert adoptions == [True]
    assert not list(tmp_path.glob("x*"))


def test_pending_tokens_are_bounded(llama3_tokenizer, llama3_tokenizer_dir, spm_corpus):
    """With a budget of one token the thread holds one document until the consumer takes it,
    and the documents still come out complete and in order."""
    spec = TokenizerSpec(tokenizer_type="HuggingFaceTokenizer",
                         tokenizer_model=llama3_tokenizer_dir)
    lines = read_lines(input_range([spm_corpus.path]))
    early = early_encode.EarlyEncoding(early_encode.tokenizer_json(spec), lines,
                                       json_keys=["text"], append_eod=True, spec=spec,
                                       max_pending_tokens=1)
    deadline = time.monotonic() + 60
    while not early._items and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert len(early._items) == 1  # blocked on the second document
    encoder = encode.FastEncoder(encode.fast_backend(llama3_tokenizer), eod=llama3_tokenizer.eod)
    got = [ids for status, ids, _ in early.adopt(encoder, vocab=llama3_tokenizer.vocab_size,
                                                 eod=llama3_tokenizer.eod)]
    want = [[*llama3_tokenizer.tokenize(t), llama3_tokenizer.eod] for t in spm_corpus.texts]
    assert [g.tolist() for g in got] == want
    assert all(isinstance(g, np.ndarray) for g in got)
