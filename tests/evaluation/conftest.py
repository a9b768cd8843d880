"""Fixtures of the evaluation tests: small HF tokenizers trained inside the session (byte-level
BPE as Llama 3 / GPT-2, and Metaspace BPE as SentencePiece Llama 2) and a random tiny
``LlamaForCausalLM`` saved with its tokenizer as an HF directory. No download."""

from __future__ import annotations

import json

import numpy as np
import pytest

from megatron_endprompt.evaluation import legacy_tasks as tasks
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


def _training_text() -> list[str]:
    """Every piece the prompts use, plus numbers, so the tokenizers learn merges for them."""
    rng = np.random.default_rng(0)
    lines = [tasks.PASSKEY_INTRO, tasks.PASSKEY_FILLER, tasks.PASSKEY_QUESTION,
             tasks.NIAH_INTRO, tasks.NIAH_QUESTION, *tasks._essay_pool()[:200]]
    for i in range(200):
        lines.append(tasks.passkey_needle(int(rng.integers(1, 50001))))
        key = f"{tasks._ADJECTIVES[i % 27]}-{tasks._NOUNS[i % 24]}"
        lines.append(tasks.niah_needle(key, str(int(rng.integers(1_000_000, 9_999_999)))))
    return lines


def build_tokenizer(kind: str, *, extra_text: tuple[str, ...] = (), vocab_size: int = 400):
    """A ``PreTrainedTokenizerFast`` (BPE, ``vocab_size`` tokens) of flavour ``bytelevel`` or
    ``metaspace``, with ``<s>``/``</s>`` (BOS added, as Llama) and ``<pad>``, trained on the
    legacy prompts plus ``extra_text``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    if kind == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        alphabet = []
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(_training_text() + list(extra_text) + ["\n"], trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>")


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
