"""The HF export loads on every serving stack: a portable ``tokenizer_config.json``
(``PreTrainedTokenizerFast``, no loader keys, ``model_max_length = L``), ``config.json`` made by
``LlamaConfig`` with linear RoPE ``s`` in both forms, files under the user's umask; the exported
demo model and a Llama-3-like tokenizer load with the Auto classes."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch
from conversion_helpers import LLAMA3_SPECIAL, THETA, VOCAB

from megatron_endprompt.conversion.hf_config import HFModelSpec, hf_config_dict
from megatron_endprompt.conversion.output import apply_umask
from megatron_endprompt.conversion.tokenizer import portable_tokenizer_config

L, S_PI = 1024, 16.0
SPEC = HFModelSpec(num_layers=4, hidden_size=64, ffn_hidden_size=176, num_attention_heads=4,
                   num_query_groups=2, head_dim=16, vocab_size=VOCAB, rms_norm_eps=1e-5,
                   rope_theta=THETA, max_position_embeddings=64,
                   extra={"bos_token_id": 1, "eos_token_id": 2})


def test_tokenizer_config_is_portable():
    saved_by_v5 = {"backend": "tokenizers", "bos_token": "<s>", "is_local": True,
                   "local_files_only": True, "model_max_length": 8192,
                   "tokenizer_class": "TokenizersBackend", "extra_special_tokens": ["<x>"]}
    got = portable_tokenizer_config(saved_by_v5, model_max_length=L)
    assert got == {"bos_token": "<s>", "model_max_length": L,
                   "tokenizer_class": "PreTrainedTokenizerFast",
                   "additional_special_tokens": ["<x>"],
                   "model_input_names": ["input_ids", "attention_mask"]}


def test_config_fields_through_llama_config():
    cfg = hf_config_dict(SPEC, target_length=L, pi_factor=S_PI)
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["max_position_embeddings"] == L
    assert cfg["rope_theta"] == THETA
    assert cfg["rope_scaling"] == {"type": "linear", "rope_type": "linear", "factor": S_PI}
    assert cfg["rope_parameters"] == {"rope_type": "linear", "factor": S_PI, "rope_theta": THETA}
    assert "transformers_version" in cfg  # written by LlamaConfig, not by hand
    assert (cfg["num_key_value_heads"], cfg["head_dim"], cfg["vocab_size"]) == (2, 16, VOCAB)
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
    from transformers import LlamaConfig

    again = LlamaConfig(**cfg)
    assert again.rope_parameters["factor"] == S_PI and again.max_position_embeddings == L


@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o022, 0o644, 0o755),
                                                         (0o077, 0o600, 0o700)])
def test_apply_umask(tmp_path, umask, file_mode, dir_mode):
    root = tmp_path / "out"
    (root / "sub").mkdir(parents=True)
    os.chmod(root, 0o700)
    for f in (root / "a", root / "sub" / "b"):
        f.write_text("x")
        os.chmod(f, 0o600)
    old = os.umask(umask)
    try:
        apply_umask(str(root))
    finally:
        os.umask(old)
    for d in (root, root / "sub"):
        assert stat.S_IMODE(d.stat().st_mode) == dir_mode
    for f in (root / "a", root / "sub" / "b"):
        assert stat.S_IMODE(f.stat().st_mode) == file_mode


def test_export_loads_with_auto_classes(converted, llama3_tokenizer, tmp_path, run_tool):
    """The exported demo model + Llama-3-like tokenizer: Auto classes load both, fields pinned,
    files 0644 and directories 0755 under umask 022."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from megatron_endprompt.cli.convert import main

    out = tmp_path / "exported"
    old = os.umask(0o022)
    try:
        rc, _, err = run_tool(main, ["megatron-to-hf", "--checkpoint", converted, "--output", out,
                                     "--tokenizer", llama3_tokenizer, "--target-length", L,
                                     "--pi-factor", S_PI, "--no-progress"])
    finally:
        os.umask(old)
    assert rc == 0, err
    with open(out / "tokenizer_config.json") as f:
        tok_cfg = json.load(f)
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tok_cfg["model_max_length"] == L
    assert not {"is_local", "local_files_only", "backend", "name_or_path"} & set(tok_cfg)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    for name in os.listdir(out):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o644, name

    tok = AutoTokenizer.from_pretrained(out)
    assert tok.model_max_length == L
    ids = tok("hello world")["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids(LLAMA3_SPECIAL[0])  # BOS as Llama-3 adds it
    assert tok.eos_token == LLAMA3_SPECIAL[1]
    cfg = AutoConfig.from_pretrained(out)
    assert cfg.max_position_embeddings == L
    rope = cfg.rope_parameters
    assert (rope["rope_type"], rope["factor"], rope["rope_theta"]) == ("linear", S_PI, THETA)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), VOCAB) and torch.isfinite(logits).all()
