"""The model runner on a random tiny Llama: chunked NLL equals the full-logits loss, sliding
windows as PoSE/LongLoRA, greedy generation with left padding equals an unpadded greedy loop,
and the perplexity data loader."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation import runner


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    model = runner.load_model(tiny_model_dir, device="cpu", dtype="float32")
    return model, runner.load_tokenizer(tiny_model_dir)


def test_window_starts():
    assert runner.window_starts(100, 30, 20) == [0, 20, 40, 60]
    assert runner.window_starts(100, 30, 20, max_windows=2) == [0, 60]
    assert runner.window_starts(100, 30, 20, max_windows=10) == [0, 20, 40, 60]
    assert runner.window_starts(30, 30, 5) == []  # needs length + 1 tokens
    assert runner.window_starts(31, 30, 5) == [0]


def test_chunked_nll_matches_full_logits(model_and_tok):
    model, _ = model_and_tok
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, model.config.vocab_size, (2, 41), generator=g)
    with torch.inference_mode():
        logits = model(input_ids=x[:, :-1]).logits
    want = F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none").sum(-1)
    got = runner.window_nll(model, x[:, :-1], x[:, 1:], chunk=7)
    torch.testing.assert_close(got.float(), want, rtol=1e-5, atol=1e-4)


def test_run_perplexity_is_token_level_over_windows(model_and_tok):
    model, _ = model_and_tok
    tokens = np.random.default_rng(0).integers(3, model.config.vocab_size, size=200)
    stats = runner.run_perplexity(model, tokens, length=64, stride=32, batch_size=3)
    starts = runner.window_starts(200, 64, 32)
    assert stats.windows == len(starts) == 5 and stats.tokens == 5 * 64
    total = 0.0
    for s in starts:
        w = torch.from_numpy(tokens[s:s + 65])[None]
        total += float(runner.window_nll(model, w[:, :-1], w[:, 1:]).sum())
    assert stats.mean_nll == pytest.approx(total / (5 * 64), rel=1e-6)
    capped = runner.run_perplexity(model, tokens, length=64, stride=32, batch_size=3,
                                   max_windows=2)
    assert capped.windows == 2


def _greedy_reference(model, prompt, steps):
    ids = torch.tensor([prompt])
    out = []
    with torch.inference_mode():
        for _ in range(steps):
            nxt = int(model(input_ids=ids).logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def test_greedy_generate_left_padding(model_and_tok):
    model, tok = model_and_tok
    rng = np.random.default_rng(1)
    prompts = [list(map(int, rng.integers(3, 300, size=n))) for n in (20, 13, 20)]
    outs = runner.greedy_generate(model, prompts, max_new_tokens=6, pad_id=tok.pad_token_id)
    for p, o in zip(prompts, outs, strict=True):
        assert o == _greedy_reference(model, p, 6)


def test_load_ppl_tokens(tmp_path, model_and_tok):
    _, tok = model_and_tok
    txt = tmp_path / "a.txt"
    txt.write_text("The sky is blue. The grass is green.", encoding="utf-8")
    ids = runner.load_ppl_tokens(str(txt), tok)
    assert ids.tolist() == tok("The sky is blue. The grass is green.",
                               add_special_tokens=False)["input_ids"]
    jl = tmp_path / "a.jsonl"
    jl.write_text(json.dumps({"text": "The sky"}) + "\n\n" + json.dumps({"text": "is blue"})
                  + "\n", encoding="utf-8")
    ids = runner.load_ppl_tokens(str(jl), tok).tolist()
    a = tok("The sky", add_special_tokens=False)["input_ids"]
    b = tok("is blue", add_special_tokens=False)["input_ids"]
    assert ids == a + [tok.eos_token_id] + b
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": 1}\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"b\.jsonl:2"):
        runner.load_ppl_tokens(str(bad), tok)
    with pytest.raises(UserError, match="no such file"):
        runner.load_ppl_tokens(str(tmp_path / "missing.txt"), tok)
    other = tmp_path / "c.csv"
    other.write_text("x", encoding="utf-8")
    with pytest.raises(UserError, match="unknown format"):
        runner.load_ppl_tokens(str(other), tok)
