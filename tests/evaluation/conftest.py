"""Fixtures of the evaluation tests: small HF tokenizers trained inside the session (byte-level
BPE as Llama 3 / GPT-2, and Metaspace BPE as SentencePiece Llama 2) and a random tiny
``LlamaForCausalLM`` saved with its tokenizer as an HF directory. No download."""

from __future__ import annotations

import json

import pytest

from megatron_endprompt.evaluation.passkey import legacy as tasks
from tests.evaluation.tiny_tokenizers import build_tokenizer
from tests.support.hf_configs import tiny_llama_config


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models run fastest on one thread (and are not slowed by a busy machine); the
    previous setting is restored after each test."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", params=["bytelevel", "metaspace"])
def hf_tokenizer(request):
    """Both tokenizer flavours (session-scoped, built once each)."""
    return build_tokenizer(request.param)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """An HF directory: random tiny Llama (2 layers, hidden 32, max positions 256, linear RoPE
    scaling 2 as the converter writes) + byte-level tokenizer. Returns the path as ``str``."""
    import torch
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp("tiny_llama")
    tok = build_tokenizer("bytelevel")
    cfg = tiny_llama_config(vocab_size=len(tok), rope_theta=10000.0,
                            rope_scaling={"rope_type": "linear", "factor": 2.0},
                            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                            pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(root)
    tok.save_pretrained(root)
    return str(root)


@pytest.fixture(scope="session")
def ppl_jsonl(tmp_path_factory):
    """A PG19-style JSONL file for the perplexity task: three documents of essay sentences
    (~2-3K tokens each under the test tokenizers)."""
    path = tmp_path_factory.mktemp("ppl") / "ppl.jsonl"
    pool = tasks._essay_pool()
    with open(path, "w", encoding="utf-8") as f:
        for d in range(3):
            f.write(json.dumps({"text": " ".join(pool[d * 200:(d + 1) * 200])}) + "\n")
    return str(path)
