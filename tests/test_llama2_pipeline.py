"""Llama-2 with its SentencePiece tokenizer in Hugging Face form, end to end: preprocess with prompt
terminals -> Megatron's ``pretrain`` (a tiny MHA Llama-2-shaped model, one CPU launch) ->
``megatron-to-hf`` -> ``transformers`` loads it and generates.

The tokenizer is :func:`~megatron_endprompt.data.prepare.synthetic.build_llama2_like_tokenizer`: a
SentencePiece BPE trained with Llama-2's settings and wrapped by transformers' own converter
(``LlamaTokenizer``): ``<unk>``/``<s>``/``</s>`` = 0/1/2 and a BOS before every text. Asserted:
a BOS only ever opens a document and never sits in a terminal, EP2 is ``</s>`` (there is no
``<|eot_id|>``), the export carries BOS 1 / EOS 2 in ``config.json`` and
``generation_config.json`` and the same ids as the source tokenizer (from the HF directory and
from the bare ``tokenizer.model``), and ``generate(**tok(text))`` stops on ``</s>``."""

from __future__ import annotations

import contextlib
import io
import json
import os

import numpy as np
import pytest

pytestmark = pytest.mark.e2e

P, L, B = 64, 512, 8
BOS, EOS = 1, 2  # Llama-2's ids (SentencePiece's defaults)


@pytest.fixture(scope="module")
def llama2_dir(spm_corpus, tmp_path_factory) -> str:
    from megatron_endprompt.data.prepare.synthetic import build_llama2_like_tokenizer

    return build_llama2_like_tokenizer(spm_corpus.path, str(tmp_path_factory.mktemp("llama2")))


@pytest.fixture(scope="module")
def trained(llama2_dir, spm_corpus, tmp_path_factory):
    """``(checkpoint, preprocess summary, samples, records)``: the prompt-terminal prefix and a
    3-iteration run on it."""
    from megatron_endprompt.cli import preprocess as preprocess_cli
    from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
    from megatron_endprompt.data.sidecar.spans import sample_reader
    from megatron_endprompt.demo_train import TINY_LLAMA, parse_losses, run_pretrain
    from megatron_endprompt.errors import run_cli

    root = tmp_path_factory.mktemp("llama2_run")
    prefix = str(root / "ep")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = run_cli(preprocess_cli.main, [
            "--input", spm_corpus.path, "--output-prefix", prefix,
            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", llama2_dir,
            "--seq-length", str(P), "--target-length", str(L), "--terminal-length", str(B),
            "--append-eod", "--no-progress", "--terminal-source", "prompt",
            "--terminal-prompts", "ep1-3", "--placement", "random", "--summary-json"])
    out = buf.getvalue()
    assert rc == 0, out
    sidecar = read_sidecar(sidecar_path(prefix))
    tokens = sample_reader(prefix, sidecar)  # composed from the corpus as training reads them
    samples = [np.asarray(tokens(i), dtype=np.int64) for i in range(sidecar.header.num_samples)]
    records = np.asarray(sidecar.records)

    g = TINY_LLAMA.index("--num-query-groups")  # Llama-2 7B/13B: multi-head attention
    mha = [a for k, a in enumerate(TINY_LLAMA) if k not in (g, g + 1)
           and a != "--group-query-attention"]
    ckpt = str(root / "ckpt")
    args = [*mha, "--num-layers", "2", "--seq-length", str(P), "--max-position-embeddings",
            str(P), "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", llama2_dir,
            "--data-path", prefix, "--split", "100,0,0", "--data-cache-path", str(root / "c"),
            "--endprompt-target-length", str(L), "--micro-batch-size", "2",
            "--global-batch-size", "2", "--train-iters", "2", "--lr", "3e-3",
            "--calculate-per-token-loss", "--log-interval", "1", "--eval-iters", "0",
            "--eval-interval", "1000", "--num-workers", "0", "--save", ckpt,
            "--save-interval", "2", "--ckpt-format", "torch_dist"]
    rc, log = run_pretrain(args, log_path=str(root / "train.log"), nproc=1)
    assert rc == 0, log[-3000:]
    assert sorted(parse_losses(log)) == [1, 2]
    return ckpt, json.loads(out[out.index("{"):]), samples, records


def test_prompt_terminals_under_llama2_tokenizer(trained, llama2_dir):
    from transformers import AutoTokenizer

    from megatron_endprompt.data.prepare.prompts import BUILTIN_PROMPTS, EOT_PROMPT

    original = AutoTokenizer.from_pretrained(llama2_dir)
    assert (original.bos_token_id, original.eos_token_id, original.unk_token_id) == (BOS, EOS, 0)
    _, summary, samples, records = trained
    assert samples and len(samples) == len(records)
    assert all(len(s) == P + 1 for s in samples)
    for s, rec in zip(samples, records):
        a = int(rec[0])
        starts = np.flatnonzero(s == BOS)  # a BOS only ever opens a document
        assert all(i == 0 or s[i - 1] == EOS for i in starts), s
        assert BOS not in s[a:].tolist(), s[a:]
    ids = summary["prompt_ids"]
    assert list(ids) == list(BUILTIN_PROMPTS)
    assert ids[EOT_PROMPT] == [EOS], "EP2 is </s>: the tokenizer has no <|eot_id|>"
    for prompt in BUILTIN_PROMPTS:
        if prompt != EOT_PROMPT:
            assert ids[prompt] == original.encode(prompt, add_special_tokens=False)
    assert min(summary["prompt_counts"].values()) > 0


@pytest.mark.parametrize("source", ["hf_dir", "tokenizer.model"])
def test_llama2_export_loads_and_generates(source, trained, llama2_dir, spm_corpus, run_tool,
                                           tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from megatron_endprompt.cli.convert import main as convert_main

    ckpt = trained[0]
    tokenizer = llama2_dir if source == "hf_dir" else os.path.join(llama2_dir, "tokenizer.model")
    out = str(tmp_path / "hf")
    rc, _, err = run_tool(convert_main, ["megatron-to-hf", "--checkpoint", ckpt, "--output", out,
                                         "--tokenizer", tokenizer, "--no-progress"])
    assert rc == 0, err
    for name in ("config.json", "generation_config.json"):
        with open(os.path.join(out, name)) as f:
            cfg = json.load(f)
        assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (BOS, EOS), name
    original = AutoTokenizer.from_pretrained(llama2_dir)
    exported = AutoTokenizer.from_pretrained(out)
    assert (exported.bos_token_id, exported.eos_token_id) == (BOS, EOS)
    for text in [*spm_corpus.texts[:5], "Hello  world 12345, \u00fcn\u00efc\u00f8d\u00e9!"]:
        plain = original.encode(text, add_special_tokens=False)
        assert exported.encode(text, add_special_tokens=False) == plain, text
        if source == "hf_dir":  # the HF directory's BOS-adding post-processor comes along
            assert exported(text).input_ids == original(text).input_ids == [BOS, *plain]

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert model.config.num_key_value_heads == model.config.num_attention_heads  # MHA
    inputs = exported(spm_corpus.texts[0][:80], return_tensors="pt")
    n, vocab = inputs["input_ids"].shape[1], model.config.vocab_size

    def forced(token):  # the given token as the 3rd new one, anything else before and after
        return lambda batch, ids: [token] if len(ids) == n + 2 else list(range(vocab))

    with torch.no_grad():
        stop = model.generate(**inputs, max_new_tokens=8, do_sample=False,
                              prefix_allowed_tokens_fn=forced(EOS))
        other = model.generate(**inputs, max_new_tokens=8, do_sample=False,
                               prefix_allowed_tokens_fn=forced(5))
    assert stop.shape[1] == n + 3 and stop[0, -1].item() == EOS
    assert other.shape[1] == n + 8
