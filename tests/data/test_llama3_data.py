"""Preprocessing and the dataset under the Llama-3-like HF tokenizer (its BOS inside terminals).

Megatron's ``HuggingFaceTokenizer`` puts ``<|begin_of_text|>`` before every tokenized string.
That is right for a document and wrong for a terminal prompt spliced into a sample."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.prepare.prompts import (BUILTIN_PROMPTS, EOD_PROMPT, EOT_PROMPT,
                                             tokenize_prompts)
from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
from megatron_endprompt.errors import UserError

P, L = 64, 512  # as in tests/conftest.py (SPM_P, SPM_L: llama3_args)


def _ids(tok_dir, *tokens):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tok_dir)
    return [hf.convert_tokens_to_ids(t) for t in tokens]


def _prompt_prefix(run_tool, llama3_args, prefix, *extra):
    rc, out, err = run_tool(preprocess_cli.main, llama3_args(
        prefix, "--terminal-source", "prompt", "--terminal-loss-weight", 0.5, *extra,
        "--summary-json"))
    assert rc == 0, err
    from megatron_endprompt.data.sidecar.spans import sample_reader

    sc = read_sidecar(sidecar_path(str(prefix)))
    tokens = sample_reader(str(prefix), sc)
    samples = [np.asarray(tokens(i), dtype=np.int64) for i in range(sc.header.num_samples)]
    return samples, sc, json.loads(out[out.index("{"):])


def test_fixture_is_llama3_like(llama3_tokenizer_dir, llama3_tokenizer):
    """The configuration users run: AutoTokenizer and Megatron load it; Megatron's tokenize
    adds BOS; the end token of a base tokenizer is <|end_of_text|>."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(llama3_tokenizer_dir)
    bos, eot, eos = _ids(llama3_tokenizer_dir, "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>")
    assert hf.bos_token_id == bos and hf.eos_token_id == eos and eot not in (bos, eos)
    assert "<|reserved_special_token_5|>" in hf.get_vocab()
    text = "The pass key of Alder is 12345."
    assert hf(text).input_ids[0] == bos
    assert llama3_tokenizer.tokenize(text) == hf(text).input_ids  # BOS included
    assert llama3_tokenizer.eod == eos
    assert hf.decode(hf(text).input_ids, skip_special_tokens=True) == text


def test_prompts_are_tokenized_without_special_tokens(llama3_tokenizer, llama3_tokenizer_dir):
    """Defect 2 (unit): no BOS in any built-in prompt's ids."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(llama3_tokenizer_dir)
    ids = tokenize_prompts(list(BUILTIN_PROMPTS), llama3_tokenizer)
    for prompt, got in zip(BUILTIN_PROMPTS, ids):
        assert hf.bos_token_id not in got.tolist(), prompt
        if prompt not in (EOD_PROMPT, EOT_PROMPT):  # markers of one special token
            assert got.tolist() == hf.encode(prompt, add_special_tokens=False)


def test_no_bos_inside_any_prompt_terminal(run_tool, llama3_args, llama3_tokenizer_dir,
                                           llama3_tokenizer, tmp_path):
    """Defect 2 (pipeline): every terminal of a prompt dataset, built-in and user prompts."""
    bos, end = _ids(llama3_tokenizer_dir, "<|begin_of_text|>", "<|end_of_text|>")
    pfile = tmp_path / "prompts.txt"
    pfile.write_text("Remember the pass key.\nEnd.\n", encoding="utf-8")
    for name, extra in (("builtin", ()), ("user", ("--terminal-prompts", pfile))):
        samples, sc, summary = _prompt_prefix(run_tool, llama3_args, tmp_path / name, *extra)
        for s, rec in zip(samples, np.asarray(sc.records)):
            a = int(rec[0])
            assert bos not in s[a:].tolist(), (name, s[a:])
            assert s[P] == end
        assert sum(summary["prompt_counts"].values()) == len(samples)


def test_ep2_is_the_tokenizers_end_token(run_tool, llama3_args, llama3_tokenizer_dir,
                                         llama3_tokenizer, spm_corpus, tmp_path):
    """Defect 3: EP2 resolves to ``eos_token`` (<|end_of_text|> for base, <|eot_id|> for
    instruct); a prompt-file line that is a special token is that single id."""
    from megatron_endprompt.data.prepare.synthetic import build_llama3_like_tokenizer
    from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer

    end, eot = _ids(llama3_tokenizer_dir, "<|end_of_text|>", "<|eot_id|>")
    assert tokenize_prompts([EOD_PROMPT], llama3_tokenizer)[0].tolist() == [end]
    instruct_dir = build_llama3_like_tokenizer(spm_corpus.texts, str(tmp_path / "instruct"),
                                               instruct=True)
    instruct = build_tokenizer(TokenizerSpec(tokenizer_type="HuggingFaceTokenizer",
                                             tokenizer_model=instruct_dir))
    assert tokenize_prompts([EOD_PROMPT], instruct)[0].tolist() == _ids(instruct_dir, "<|eot_id|>")
    named = tokenize_prompts(["<|eot_id|>", "<|end_of_text|>", " <|eot_id|> "], llama3_tokenizer)
    assert [x.tolist() for x in named] == [[eot], [end], [eot]]
    with pytest.raises(UserError, match="no such token"):
        tokenize_prompts(["<|no_such_token|>"], llama3_tokenizer)
    # through the tool, the EP1-EP3 mixture: the built-in EP2 is <|eot_id|> (the paper's), then
    # the <end_of_text> label
    samples, sc, summary = _prompt_prefix(run_tool, llama3_args, tmp_path / "ep2",
                                          "--terminal-prompts", "ep1-3")
    assert summary["prompt_ids"][EOT_PROMPT] == [eot]
    ep2 = [s for s, r in zip(samples, np.asarray(sc.records)) if r[0] == P - 1]
    assert ep2 and all(s[P - 1] == eot and s[P] == end for s in ep2)
    pfile = tmp_path / "eot.txt"
    pfile.write_text("<|eot_id|>\n", encoding="utf-8")
    samples, sc, summary = _prompt_prefix(run_tool, llama3_args, tmp_path / "eot",
                                          "--terminal-prompts", pfile)
    assert np.all(np.asarray(sc.records)[:, 0] == P - 1)
    assert all(s[P - 1] == eot for s in samples)


def test_eod_mask_loss_keeps_prompt_terminal_weights(run_tool, llama3_args, llama3_tokenizer,
                                                      tmp_path):
    """Defect 3: with --eod-mask-loss, the terminal predictions keep the terminal weight (the
    one of EP2 is made from the context's last token, often EOD); EOD inputs in the context are
    still masked; the prediction after the last prompt token has weight 0 (the paper's
    objective)."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )

    from megatron_endprompt.data.dataset import EndPromptDatasetConfig, EndPromptGPTDataset

    prefix = tmp_path / "ep"
    _, sc, _ = _prompt_prefix(run_tool, llama3_args, prefix, "--terminal-prompts", "ep1-3")
    config = EndPromptDatasetConfig(
        random_seed=1, sequence_length=P, blend=([str(prefix)], [1.0]), split="100,0,0",
        tokenizer=llama3_tokenizer, reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=True, create_attention_mask=False, path_to_cache=str(tmp_path / "cache"),
        endprompt_target_length=L)
    ds = BlendedMegatronDatasetBuilder(EndPromptGPTDataset, [30, 0, 0], lambda: True,
                                       config).build()[0]
    inner = list(getattr(ds, "datasets", [ds]))[0]
    eod = llama3_tokenizer.eod
    ep2 = context_eods = 0
    for i in range(len(inner)):
        s = inner[i]
        a = int(sc.records[int(inner.document_index[i])][0])
        lm, tokens = s["loss_mask"], s["tokens"]
        assert torch.all(lm[a - 1:P - 1] == 0.5), "terminal weights kept"
        assert lm[P - 1] == 0, "no prediction after the last prompt token"
        ctx_eod = (tokens[:a - 1] == eod).nonzero().flatten()
        context_eods += len(ctx_eod)
        assert torch.all(lm[ctx_eod] == 0)
        ep2 += int(a == P - 1)
    assert ep2 > 0 and context_eods > 0
    # Llama-3 has no pad token (``tokenizer.pad`` is None): the last label without the extra
    # token is still padding with weight 0
    config.add_extra_token_to_sequence = False
    config.path_to_cache = str(tmp_path / "cache2")
    ds = BlendedMegatronDatasetBuilder(EndPromptGPTDataset, [4, 0, 0], lambda: True,
                                       config).build()[0]
    s = ds[0]
    assert s["loss_mask"][-1] == 0 and s["labels"][-1] == 0
