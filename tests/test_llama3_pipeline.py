"""The production tokenizer end to end (toy tokenizers hid its BOS and EOT): a Llama-3-like HF
tokenizer through preprocess (every terminal source, the built-in prompts) -> EndPromptGPTDataset ->
Megatron's ``pretrain`` (one tiny CPU launch, a blend of the three prefixes, ``--eod-mask-loss``) ->
``megatron-to-hf`` export -> ``transformers`` -> greedy answers to a few prompts and a perplexity.

Asserted: no BOS inside any terminal (a BOS only ever starts a document), EP2 is the
tokenizer's end token ``<|end_of_text|>``, the exported tokenizer gives the same ids as the
one we trained with, and the exported model scores text better than uniform."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.e2e

P, L, B = 64, 512, 8  # as in tests/conftest.py (llama3_args)
SOURCES = ("continuation", "document-tail", "prompt")


def _preprocess(run_tool, llama3_args, prefix, source):
    from megatron_endprompt.cli import preprocess as preprocess_cli
    from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
    from megatron_endprompt.data.sidecar.spans import sample_reader

    rc, out, err = run_tool(preprocess_cli.main, llama3_args(
        prefix, "--terminal-source", source, "--placement", "random",
        *(("--terminal-prompts", "ep1-3") if source == "prompt" else ()),
        "--terminal-loss-weight", 0.5, "--summary-json"))
    assert rc == 0, err
    sidecar = read_sidecar(sidecar_path(str(prefix)))
    tokens = sample_reader(str(prefix), sidecar)  # the samples, as training composes them
    samples = [np.asarray(tokens(i), dtype=np.int64) for i in range(sidecar.header.num_samples)]
    records = np.asarray(sidecar.records)
    assert len(samples) == len(records) and all(len(x) == P + 1 for x in samples)
    return samples, records, json.loads(out[out.index("{"):])


def test_llama3_tokenizer_pipeline(run_tool, llama3_args, llama3_tokenizer_dir,
                                   llama3_tokenizer, spm_corpus, tmp_path):
    import torch
    from transformers import AutoTokenizer

    from megatron_endprompt.cli.convert import main as convert_main
    from megatron_endprompt.data.prepare.prompts import BUILTIN_PROMPTS, EOD_PROMPT, EOT_PROMPT
    from megatron_endprompt.demo_train import TINY_LLAMA, parse_losses, run_pretrain
    from megatron_endprompt.evaluation.perplexity.windows import run_doc_perplexity
    from megatron_endprompt.evaluation.core.runner import (greedy_generate, load_model,
                                                           load_tokenizer)
    from megatron_endprompt.layout import positions_from_record
    from megatron_endprompt.training.loss import read_loss_log

    original = AutoTokenizer.from_pretrained(llama3_tokenizer_dir)
    bos, end = original.bos_token_id, original.convert_tokens_to_ids("<|end_of_text|>")
    assert original.eos_token_id == end == llama3_tokenizer.eod

    # -- preprocess: every terminal source ------------------------------------------------
    prefixes = {}
    for source in SOURCES:
        prefixes[source] = str(tmp_path / source)
        samples, records, summary = _preprocess(run_tool, llama3_args, prefixes[source], source)
        assert samples
        for s, rec in zip(samples, records):
            a = int(rec[0])
            starts = np.flatnonzero(s == bos)  # a BOS only ever opens a document
            assert all(i == 0 or s[i - 1] == end for i in starts), (source, s)
            if source == "prompt" or not np.array_equal(positions_from_record(rec, P),
                                                        np.arange(P)):
                if source != "continuation":  # a prompt, or one document's own tail
                    assert bos not in s[a:].tolist(), (source, s[a:])
        if source == "prompt":
            assert list(summary["prompt_ids"]) == list(BUILTIN_PROMPTS)
            eot = original.convert_tokens_to_ids("<|eot_id|>")
            assert summary["prompt_ids"][EOT_PROMPT] == [eot], "EP2 is <|eot_id|> (the paper's)"
            assert all(bos not in ids for ids in summary["prompt_ids"].values())
            assert min(summary["prompt_counts"].values()) > 0

    # -- train: one tiny launch on the blend of the three prefixes ---------------------------
    ckpt, losses_dir = str(tmp_path / "ckpt"), str(tmp_path / "losses")
    args = [*TINY_LLAMA, "--num-layers", "2",
            "--seq-length", str(P), "--max-position-embeddings", str(P),
            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", llama3_tokenizer_dir,
            "--data-path", *[x for p in prefixes.values() for x in ("1", p)],
            "--split", "100,0,0", "--data-cache-path", str(tmp_path / "cache"),
            "--endprompt-target-length", str(L), "--eod-mask-loss",
            "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "3",
            "--lr", "3e-3", "--min-lr", "3e-3", "--lr-decay-style", "constant",
            "--seed", "1234", "--calculate-per-token-loss", "--log-interval", "1",
            "--eval-iters", "0", "--eval-interval", "1000", "--num-workers", "0",
            "--save", ckpt, "--save-interval", "3", "--ckpt-format", "torch_dist",
            "--endprompt-loss-log", losses_dir]
    rc, log = run_pretrain(args, log_path=str(tmp_path / "train.log"), nproc=1)
    assert rc == 0, log[-3000:]
    assert sorted(parse_losses(log)) == [1, 2, 3]
    terminal = read_loss_log(losses_dir, "terminal loss")
    assert sorted(terminal) == [1, 2, 3] and all(np.isfinite(v) for v in terminal.values())

    # -- export to HF and load in transformers ---------------------------------------------
    hf_dir = str(tmp_path / "hf")
    rc, _, err = run_tool(convert_main, ["megatron-to-hf", "--checkpoint", ckpt, "--output",
                                         hf_dir, "--tokenizer", llama3_tokenizer_dir,
                                         "--no-progress"])
    assert rc == 0, err
    exported = load_tokenizer(hf_dir)
    with open(f"{hf_dir}/tokenizer_config.json") as f:  # transformers 4.x loads it too
        assert json.load(f)["tokenizer_class"] == "PreTrainedTokenizerFast"
    texts = [*spm_corpus.texts[:5],
             *[p for p in BUILTIN_PROMPTS if p not in (EOD_PROMPT, EOT_PROMPT)],
             "<|eot_id|>", "Mixed <|end_of_text|> text."]
    for text in texts:
        assert exported(text).input_ids == original(text).input_ids \
            == llama3_tokenizer.tokenize(text), text
        assert exported.encode(text, add_special_tokens=False) \
            == original.encode(text, add_special_tokens=False)
    assert (exported.bos_token_id, exported.eos_token_id) == (bos, end), "EP2's token exported"
    model = load_model(hf_dir, device="cpu", dtype="float32", attn_implementation="eager")
    assert model.config.vocab_size >= len(exported)

    # -- evaluate a few prompts ---------------------------------------------------------------
    questions = ["The pass key of Alder is", "A merchant watches", "End."]
    answers = greedy_generate(model, [exported(q).input_ids for q in questions],
                              max_new_tokens=4, pad_id=end, eos_ids=[end])
    assert len(answers) == 3 and all(len(a) <= 4 for a in answers)
    assert all(0 <= t < model.config.vocab_size for a in answers for t in a)
    tokens = np.asarray([t for text in spm_corpus.texts[:8] for t in original(text).input_ids])
    ppl = run_doc_perplexity(model, [tokens], length=P, stride=P, max_windows=4)["ppl"]
    print(f"exported model: perplexity {ppl:.1f} (uniform: {len(exported)}); answers {answers}")
    assert np.isfinite(ppl) and ppl < len(exported), "the trained model beats uniform"
    with torch.no_grad():
        ids = torch.as_tensor([original(questions[0]).input_ids])
        assert torch.isfinite(model(ids).logits).all()
