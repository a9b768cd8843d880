""":class:`HybridLayers`: a Llama-style ``HybridModel`` checkpoint's keys <-> the equal GPT
model's (hybrid layer ``2i`` = GPT layer ``i``'s attention half, ``2i + 1`` its MLP half,
``final_norm`` = ``final_layernorm``); other patterns refused in one line."""

from __future__ import annotations

import argparse

import pytest

from megatron_endprompt.conversion.hybrid_layers import HybridLayers
from megatron_endprompt.conversion.mapping import Dims, expand, model_mappings
from megatron_endprompt.errors import UserError


def _dims(layers: int) -> Dims:
    return Dims(num_layers=layers, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                num_query_groups=2, head_dim=16, vocab_size=1000, tied=False,
                padded_vocab_size=1024)


@pytest.mark.parametrize("qkv_bias, qk_norm", [(False, False), (True, True)])
def test_every_gpt_tensor_has_one_hybrid_key_and_back(qkv_bias, qk_norm):
    layers = HybridLayers(pattern="*-*-|*-")
    assert layers.num_layers == 3
    work = list(expand(model_mappings(qkv_bias=qkv_bias, qk_norm=qk_norm), _dims(3)))
    keys = [layers.checkpoint_key(m.checkpoint_key(), layer) for m, layer in work]
    assert len(set(keys)) == len(keys)
    for (m, layer), key in zip(work, keys):
        assert layers.gpt_key(key) == (m.checkpoint_key(), layer if m.per_layer else None)
    assert "decoder.final_norm.weight" in keys and "embedding.word_embeddings.weight" in keys
    assert "decoder.layers.4.self_attention.linear_qkv.layer_norm_weight" in keys
    assert "decoder.layers.5.mlp.linear_fc1.layer_norm_weight" in keys
    assert {int(k.split(".")[2]) for k in keys if k.startswith("decoder.layers.")} == set(range(6))


def test_keys_outside_the_pattern_are_errors():
    layers = HybridLayers(pattern="*-")
    with pytest.raises(ValueError):
        layers.checkpoint_key("decoder.layers.self_attention.linear_qkv.weight", 1)
    with pytest.raises(ValueError):
        layers.gpt_key("decoder.layers.1.self_attention.linear_qkv.weight")  # an MLP layer
    with pytest.raises(ValueError):
        layers.gpt_key("decoder.layers.2.self_attention.linear_qkv.weight")  # past the end


@pytest.mark.parametrize("pattern", ["M*-", "*-E-", "*-*-/*-", "-*", "**--", "*", "*G-"])
def test_other_patterns_are_refused_in_one_line(pattern):
    with pytest.raises(UserError) as err:
        HybridLayers.from_args(argparse.Namespace(hybrid_layer_pattern=pattern))
    msg = str(err.value)
    assert "\n" not in msg and f"--hybrid-layer-pattern {pattern!r}" in msg
    assert "not Llama-style" in msg


def test_gpt_checkpoints_have_no_hybrid_layers():
    assert HybridLayers.from_args(argparse.Namespace(hybrid_layer_pattern=None)) is None
    assert HybridLayers.from_args(argparse.Namespace()) is None
