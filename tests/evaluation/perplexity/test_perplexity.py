"""The per-document PPL protocol (BOS first, sliding windows scoring only new tokens)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation.perplexity import windows as perplexity
from megatron_endprompt.evaluation.core import runner


def test_doc_windows_score_every_token_once():
    for n, length, stride in ((10, 4, 2), (100, 30, 7), (31, 30, 5), (5, 30, 256),
                              (50, 8, 8), (50, 8, 20)):  # stride >= length: no token lost
        wins = perplexity.doc_windows(n, length, stride)
        scored = []
        for begin, end, new in wins:
            assert end - begin <= length and new <= end - begin - 1  # first token: context
            scored += list(range(end - new, end))
        assert scored == list(range(1, n))  # each target once, BOS (index 0) never
    assert perplexity.doc_windows(10, 4, 2)[:3] == [(0, 4, 3), (2, 6, 2), (4, 8, 2)]


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    return (runner.load_model(tiny_model_dir, device="cpu", dtype="float32"),
            runner.load_tokenizer(tiny_model_dir))


def test_doc_perplexity_matches_direct_loss(model_and_tok):
    """One window per document (length >= doc): PPL = exp(mean CE of the document's tokens
    after BOS). With a stride: each token scored once with the window before it as context."""
    model, _ = model_and_tok
    rng = np.random.default_rng(0)
    docs = [np.concatenate([[1], rng.integers(4, 300, size=k)]) for k in (60, 90)]
    skip = perplexity.run_doc_perplexity(model, docs, length=80, stride=16)
    assert skip["docs"] == 1 and skip["docs_skipped"] == 1  # the 61-token doc is too short
    got = perplexity.run_doc_perplexity(model, docs[:1], length=61, stride=16)
    with torch.inference_mode():
        x = torch.from_numpy(docs[0])[None]
        want = F.cross_entropy(model(input_ids=x).logits[0, :-1], x[0, 1:], reduction="sum")
    assert got["tokens"] == 60 and got["nll"] == pytest.approx(float(want) / 60, rel=1e-5)
    strided = perplexity.run_doc_perplexity(model, docs, length=32, stride=16)
    assert strided["tokens"] == 60 + 90 and strided["docs"] == 2
    manual = 0.0
    for d in docs:
        for begin, end, new in perplexity.doc_windows(len(d), 32, 16):
            with torch.inference_mode():
                x = torch.from_numpy(d[begin:end])[None]
                lp = model(input_ids=x).logits[0, :-1]
                manual += float(F.cross_entropy(lp[-new:], x[0, 1:][-new:], reduction="sum"))
    assert strided["nll"] == pytest.approx(manual / 150, rel=1e-5)


def test_documents_with_bos(tmp_path, model_and_tok):
    _, tok = model_and_tok
    jl = tmp_path / "pg19.jsonl"
    jl.write_text(json.dumps({"text": "The sky"}) + "\n\n" + json.dumps({"text": "is blue"})
                  + "\n", encoding="utf-8")
    docs = perplexity.tokenize_documents(tok, perplexity.load_documents(str(jl)))
    assert [d.tolist() for d in docs] == [
        [tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"]
        for t in ("The sky", "is blue")]
    assert len(perplexity.tokenize_documents(tok, ["The sky is blue"], max_tokens=2)[0]) == 2
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": 1}\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"b\.jsonl:2"):
        perplexity.load_documents(str(bad))
    with pytest.raises(UserError, match="no such file"):
        perplexity.load_documents(str(tmp_path / "missing.txt"))
    other = tmp_path / "c.csv"
    other.write_text("x", encoding="utf-8")
    with pytest.raises(UserError, match="unknown format"):
        perplexity.load_documents(str(other))


def test_legacy_stream_and_window_cap(model_and_tok):
    """--ppl-protocol legacy-stream: the old EOS-joined stream, every token of each window
    scored; --ppl-max-windows caps the windows of either protocol."""
    model, tok = model_and_tok
    texts = ["The sky is blue. " * 12, "The grass is green. " * 12]
    got = perplexity.run_stream_perplexity(model, tok, texts, length=32, stride=16)
    a, b = (tok(t, add_special_tokens=False)["input_ids"] for t in texts)
    stream = np.asarray(a + [tok.eos_token_id] + b)
    starts = list(range(0, len(stream) - 32, 16))
    total = 0.0
    for s in starts:
        with torch.inference_mode():
            x = torch.from_numpy(stream[s:s + 33])[None]
            total += float(F.cross_entropy(model(input_ids=x[:, :-1]).logits[0], x[0, 1:],
                                           reduction="sum"))
    assert got["windows"] == len(starts) and got["tokens"] == 32 * len(starts)
    assert got["nll"] == pytest.approx(total / got["tokens"], rel=1e-5)
    capped = perplexity.run_stream_perplexity(model, tok, texts, length=32, stride=16,
                                              max_windows=2)
    assert capped["windows"] == 2
    docs = perplexity.tokenize_documents(tok, texts)
    assert perplexity.run_doc_perplexity(model, docs, length=32, stride=8,
                                         max_windows=3)["windows"] == 3
