"""The model runner on a random tiny Llama: greedy generation with left padding equals an
unpadded greedy loop (perplexity: test_eval_passkey_ppl)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megatron_endprompt.evaluation.core import runner


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    model = runner.load_model(tiny_model_dir, device="cpu", dtype="float32")
    return model, runner.load_tokenizer(tiny_model_dir)


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
