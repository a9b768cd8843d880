"""Prompt-terminal defaults as in the EndPrompt paper (what its results were trained with): EP2 is
``<|eot_id|>`` where the tokenizer has it, the default set is EP1 alone (the EP1-EP3 mixture by
name), prompt terminals default to a small ``w`` (0.1; the paper gives no value), and no prediction
follows the last prompt token. Under the Llama-3-like HF tokenizer and under SentencePiece."""

from __future__ import annotations

import json

import numpy as np
import pytest

from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.prepare.prompts import BUILTIN_PROMPTS, tokenize_prompts
from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
from megatron_endprompt.layout import LayoutConfig, loss_weights_from_record
from megatron_endprompt.loss_weights import LossWeights

P, L = 64, 512  # tests/conftest.py's SPM_P, SPM_L
EP1 = "This is the end of text, please pay attention here."


def _run(run_tool, argv):
    rc, out, err = run_tool(preprocess_cli.main, [*argv, "--summary-json"])
    assert rc == 0, err
    return json.loads(out[out.index("{"):])


def _hf_id(tok_dir, token):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tok_dir).convert_tokens_to_ids(token)


def test_builtin_ep2_is_eot_where_the_tokenizer_has_it(llama3_tokenizer, llama3_tokenizer_dir,
                                                       spm_tokenizer):
    """Llama-3 base: EP2 is <|eot_id|>, not its eos <|end_of_text|>; SentencePiece (no
    <|eot_id|>): its end token."""
    eot = _hf_id(llama3_tokenizer_dir, "<|eot_id|>")
    assert eot != llama3_tokenizer.eod
    assert tokenize_prompts(list(BUILTIN_PROMPTS), llama3_tokenizer)[1].tolist() == [eot]
    assert tokenize_prompts(list(BUILTIN_PROMPTS), spm_tokenizer)[1].tolist() == \
        [spm_tokenizer.eod]


def test_default_prompt_set_is_ep1_and_the_mixture_is_named(run_tool, llama3_args, spm_args,
                                                            tmp_path):
    """No --terminal-prompts: EP1 alone; --terminal-prompts ep1-3: the three; the summary says
    what EP2 became."""
    _run(run_tool, llama3_args(tmp_path / "d", "--terminal-source", "prompt"))
    assert read_sidecar(sidecar_path(str(tmp_path / "d"))).header.prompts == [EP1]
    s = _run(run_tool, llama3_args(tmp_path / "m", "--terminal-source", "prompt",
                                   "--terminal-prompts", "ep1-3"))
    assert read_sidecar(sidecar_path(str(tmp_path / "m"))).header.prompts == list(BUILTIN_PROMPTS)
    assert len(BUILTIN_PROMPTS) == 3 and s["ep2"].startswith("<|eot_id|>")
    s = _run(run_tool, spm_args(tmp_path / "s", "--terminal-source", "prompt",
                                "--terminal-prompts", "ep1-3"))
    assert "has no <|eot_id|>" in s["ep2"]


def test_prompt_terminals_default_to_a_small_weight(run_tool, spm_args, tmp_path):
    """w = 0.1 for prompt terminals when not given; other sources keep 1.0; an explicit w wins."""
    for name, extra, w in (("p", ("--terminal-source", "prompt"), 0.1),
                           ("c", ("--terminal-source", "continuation"), 1.0),
                           ("e", ("--terminal-source", "prompt",
                                  "--terminal-loss-weight", 1), 1.0)):
        _run(run_tool, spm_args(tmp_path / name, *extra))
        layout = read_sidecar(sidecar_path(str(tmp_path / name))).layout
        assert layout.loss_weights.terminal == pytest.approx(w), name


def test_no_prediction_after_the_last_prompt_token(run_tool, llama3_args, llama3_tokenizer,
                                                   tmp_path):
    """loss_mask[i] weights the prediction of token i + 1: for a prompt sample [P - 1] (the
    label after the prompt) is 0, the prompt's own predictions [a - 1, P - 1) keep w; a
    continuation terminal keeps w at [P - 1]."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )

    from megatron_endprompt.data.dataset import EndPromptDatasetConfig, EndPromptGPTDataset

    rec = np.array([P - 4, L - 4], dtype=np.int32)
    cont = loss_weights_from_record(rec, P, LossWeights(terminal=0.1, context=1.0))
    assert cont[-1] == pytest.approx(0.1)
    for source in ("prompt", "continuation"):
        prefix = tmp_path / source
        _run(run_tool, llama3_args(prefix, "--terminal-source", source))
        config = EndPromptDatasetConfig(
            random_seed=1, sequence_length=P, blend=([str(prefix)], [1.0]), split="100,0,0",
            tokenizer=llama3_tokenizer, reset_position_ids=False, reset_attention_mask=False,
            eod_mask_loss=False, create_attention_mask=False,
            path_to_cache=str(tmp_path / f"cache_{source}"), endprompt_target_length=L)
        ds = BlendedMegatronDatasetBuilder(EndPromptGPTDataset, [8, 0, 0], lambda: True,
                                           config).build()[0]
        inner = list(getattr(ds, "datasets", [ds]))[0]
        sc = read_sidecar(sidecar_path(str(prefix)))
        for i in range(len(inner)):
            lm = inner[i]["loss_mask"].numpy()
            a = int(sc.records[int(inner.document_index[i])][0])
            if source == "prompt":
                assert lm[P - 1] == 0 and np.allclose(lm[a - 1:P - 1], 0.1)
                assert np.all(lm[:a - 1] == 1)
            else:
                assert lm[P - 1] == pytest.approx(1.0)
    assert LayoutConfig(seq_length=P, target_length=L).loss_weights.terminal == 1.0
