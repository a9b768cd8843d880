"""A *trained* checkpoint hands off with the tokenizer's BOS/EOS and a GPT-2-style tokenizer
generates from ``model.generate(**tok(text))``.

Before the fix, a checkpoint saved by ``pretrain`` had lost the source HF config, and the export
wrote ``LlamaConfig``'s defaults ``bos_token_id: 1, eos_token_id: 2`` into ``config.json`` and
``generation_config.json``: ``generate`` then stopped on id 2 (``#`` for Meta's Llama-3) and ran
past the real EOS. The conversion tests' shared ``trained_checkpoint`` (``make_hf_model``'s
ids 1/2 in the source config, trained by ``pretrain`` under torchrun; tests/conversion/conftest.py)
is exported with the Llama-3-like fixture and with a GPT-2-style ``vocab.json``/``merges.txt``.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from conversion_helpers import VOCAB, read_config

pytestmark = pytest.mark.process

V = VOCAB  # the trained model's vocabulary (the tokenizers' ids fit below it)


def _gpt2_style_dir(texts, out_dir: str) -> str:
    """GPT-2's on-disk form: ``vocab.json`` + ``merges.txt`` only, ``<|endoftext|>`` last."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=500, special_tokens=[], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(out_dir)
    tok.model.save(out_dir)  # vocab.json, merges.txt
    with open(os.path.join(out_dir, "vocab.json")) as f:
        vocab = json.load(f)
    vocab["<|endoftext|>"] = len(vocab)
    with open(os.path.join(out_dir, "vocab.json"), "w") as f:
        json.dump(vocab, f)
    return out_dir


def _export(run_tool, ckpt, out, tokenizer):
    from megatron_endprompt.cli.convert import main

    rc, _, err = run_tool(main, ["megatron-to-hf", "--checkpoint", ckpt, "--output", out,
                                 "--tokenizer", tokenizer, "--no-progress"])
    assert rc == 0, err


def _stops_on_eos(out: str, text: str) -> None:
    """``generate(**tok(text))`` runs, and stops where the tokenizer's EOS is emitted (forced at
    the third new token); id 2 (LlamaConfig's default EOS) forced instead does not stop it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    inputs = tok(text, return_tensors="pt")
    assert "token_type_ids" not in inputs  # what broke generate(**tok(text)) on 4.57
    n = inputs["input_ids"].shape[1]

    def forced(token):
        return lambda batch, ids: [token] if len(ids) == n + 2 else list(range(V))

    with torch.no_grad():
        got = model.generate(**inputs, max_new_tokens=8, do_sample=False,
                             prefix_allowed_tokens_fn=forced(tok.eos_token_id))
        assert got.shape[1] == n + 3 and got[0, -1].item() == tok.eos_token_id
        other = model.generate(**inputs, max_new_tokens=8, do_sample=False,
                               prefix_allowed_tokens_fn=forced(2))
    assert other.shape[1] == n + 8


@pytest.mark.parametrize("kind", ["llama3", "gpt2"])
def test_trained_export_carries_tokenizer_ids(kind, trained_checkpoint, llama3_tokenizer_dir,
                                              spm_corpus, run_tool, tmp_path):
    from transformers import AutoTokenizer

    ckpt = trained_checkpoint
    source = llama3_tokenizer_dir if kind == "llama3" else \
        _gpt2_style_dir(spm_corpus.texts, str(tmp_path / "gpt2"))
    out = str(tmp_path / f"hf_{kind}")
    _export(run_tool, ckpt, out, source)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.eos_token_id not in (None, 2) and tok.eos_token_id < V
    cfg = read_config(out)
    with open(os.path.join(out, "generation_config.json")) as f:
        gen = json.load(f)
    for c in (cfg, gen):
        assert c["eos_token_id"] == tok.eos_token_id
        assert c.get("bos_token_id") == tok.bos_token_id
    _stops_on_eos(out, spm_corpus.texts[0][:80])
