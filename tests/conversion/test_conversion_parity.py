"""HF Llama -> Megatron -> HF: logit parity with EndPrompt positions (TP=1, in process), bit-exact
round trip, and the exported directory working with ``AutoModelForCausalLM``."""

from __future__ import annotations

import json

import pytest
import torch
from conversion_helpers import (
    KV_HEADS,
    THETA,
    VOCAB,
    WINDOW,
    assert_matches_linear_pi_hf,
    endprompt_positions,
    hf_model,
    hf_tensors,
    read_config,
)

L, S_PI, SEQ = 1024, 16.0, 48


def _batch():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=gen)
    pos = torch.cat((endprompt_positions(SEQ, 40, L), endprompt_positions(SEQ, 20, L - 100)))
    return ids, pos


def test_logits_match_hf_with_endprompt_positions(tiny_hf, converted, megatron_forward):
    """Converted checkpoint in ``EndPromptGPTModel`` (s=16) vs HF ``LlamaForCausalLM`` with
    linear RoPE scaling 16, same EndPrompt positions (terminal near L): max |diff| <= 1e-4."""
    ids, pos = _batch()
    mg = megatron_forward(converted, ids, pos, S_PI)
    assert mg.logits.shape == (2, SEQ, 1024)  # padded for TP=2: multiple of 256
    assert_matches_linear_pi_hf(mg.logits, tiny_hf, ids, pos, pi_factor=S_PI, theta=THETA,
                                label="TP=1")


def test_round_trip_is_bit_exact_and_export_is_complete(tiny_hf, converted, tmp_path,
                                                        megatron_forward, run_tool):
    from megatron_endprompt.cli.convert import main

    out = tmp_path / "exported"
    rc, stdout, err = run_tool(main, ["megatron-to-hf", "--checkpoint", converted, "--output",
                                      out, "--target-length", L, "--pi-factor", S_PI,
                                      "--no-progress"])
    assert rc == 0, err
    assert "linear RoPE factor 16" in stdout
    # every tensor bit-exact, names and shapes identical, vocabulary unpadded
    src, dst = hf_tensors(tiny_hf), hf_tensors(str(out))
    assert sorted(src) == sorted(dst)
    for name in src:
        assert src[name].dtype == dst[name].dtype and torch.equal(src[name], dst[name]), name
    # config: L, linear s in both forms, theta kept, GQA, original token ids
    cfg = read_config(str(out))
    assert cfg["max_position_embeddings"] == L and cfg["vocab_size"] == VOCAB
    assert cfg["rope_parameters"] == {"rope_type": "linear", "factor": S_PI, "rope_theta": THETA}
    assert cfg["rope_scaling"] == {"type": "linear", "rope_type": "linear", "factor": S_PI}
    assert cfg["rope_theta"] == THETA and cfg["num_key_value_heads"] == KV_HEADS
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
    # loads with the Auto classes, RoPE as written, generates; logits = Megatron's
    from transformers import AutoConfig

    auto = AutoConfig.from_pretrained(out)
    assert auto.rope_parameters["rope_type"] == "linear"
    assert auto.rope_parameters["factor"] == S_PI and auto.rope_parameters["rope_theta"] == THETA
    model = hf_model(str(out))
    ids, pos = _batch()
    with torch.no_grad():
        got = model(input_ids=ids, position_ids=pos).logits
        gen = model.generate(ids[:1, :8], max_new_tokens=5, do_sample=False)
    assert gen.shape == (1, 13)
    mg = megatron_forward(converted, ids, pos, S_PI)
    assert (got - mg.logits[..., :VOCAB]).abs().max().item() <= 1e-4


def test_default_export_keeps_original_window(converted, tmp_path, run_tool):
    """No EndPrompt training and no flags: the original window, no scaling."""
    from megatron_endprompt.cli.convert import main

    out = tmp_path / "plain"
    rc, _, err = run_tool(main, ["megatron-to-hf", "--checkpoint", converted, "--output", out,
                                 "--no-progress"])
    assert rc == 0, err
    cfg = read_config(str(out))
    assert cfg["max_position_embeddings"] == WINDOW
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": THETA}
    assert "rope_scaling" not in cfg


def test_spm_tokenizer_is_converted(spm_corpus, converted, tmp_path, run_tool):
    """A SentencePiece model becomes an HF tokenizer with the same ids."""
    import sentencepiece as spm
    from transformers import AutoTokenizer

    from megatron_endprompt.cli.convert import main

    out = tmp_path / "with_tok"
    rc, _, err = run_tool(main, ["megatron-to-hf", "--checkpoint", converted, "--output", out,
                                 "--tokenizer", spm_corpus.model, "--no-progress"])
    assert rc == 0, err
    tok = AutoTokenizer.from_pretrained(out)
    sp = spm.SentencePieceProcessor(model_file=spm_corpus.model)
    for text in spm_corpus.texts[:20] + ["Hello  world, ünïcødé!"]:
        assert tok.encode(text, add_special_tokens=False) == sp.encode(text)
    assert read_config(str(out))["vocab_size"] == VOCAB  # recorded HF vocab wins
    with open(out / "tokenizer_config.json") as f:
        tok_cfg = json.load(f)
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"  # transformers 4.x loads it
    assert tok_cfg["model_max_length"] == WINDOW  # no EndPrompt run recorded: L = L0


@pytest.mark.parametrize("te_spec", [False, True])
def test_mapping_covers_both_layer_specs(te_spec):
    """Module names of the local and the TE layer spec, checkpoint keys shared."""
    from megatron_endprompt.conversion.mapping import LLAMA_MAPPINGS

    names = {m.megatron_name(layer=0, te_spec=te_spec) for m in LLAMA_MAPPINGS}
    if te_spec:
        assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in names
        assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in names
    else:
        assert "decoder.layers.0.input_layernorm.weight" in names
        assert "decoder.layers.0.pre_mlp_layernorm.weight" in names
    keys = {m.checkpoint_key() for m in LLAMA_MAPPINGS}
    assert "decoder.layers.self_attention.linear_qkv.layer_norm_weight" in keys
