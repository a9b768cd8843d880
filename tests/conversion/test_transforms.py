"""One class per HF <-> Megatron transform: shapes and both directions, bit-exact."""

from __future__ import annotations

import pytest
import torch
from conversion_helpers import HEADS, KV_HEADS

from megatron_endprompt.conversion.mapping import LLAMA_MAPPINGS
from megatron_endprompt.conversion.transforms import (
    Dims,
    GateUpConcat,
    HeadNorm,
    Identity,
    Norm,
    QKVBiasFusedPerGroup,
    QKVFusedPerGroup,
    VocabPad,
)

DIMS = Dims(num_layers=1, hidden_size=8, ffn_hidden_size=12, num_attention_heads=HEADS,
            num_query_groups=KV_HEADS, head_dim=2, vocab_size=10, padded_vocab_size=16)


def test_qkv_is_fused_per_query_group():
    """Megatron's fused QKV is ``[q heads of group g, k_g, v_g]`` for each group g."""
    d = 2
    dims = Dims(num_layers=1, hidden_size=1, ffn_hidden_size=1, num_attention_heads=HEADS,
                num_query_groups=KV_HEADS, head_dim=d, vocab_size=1, padded_vocab_size=1)
    q = torch.arange(HEADS * d, dtype=torch.float32)[:, None]          # head h -> 2h, 2h+1
    k = 100 + torch.arange(KV_HEADS * d, dtype=torch.float32)[:, None]
    v = 200 + torch.arange(KV_HEADS * d, dtype=torch.float32)[:, None]
    qkv = QKVFusedPerGroup()
    fused = qkv.to_megatron((q, k, v), dims)[:, 0].tolist()
    assert fused == [0, 1, 2, 3, 100, 101, 200, 201, 4, 5, 6, 7, 102, 103, 202, 203]


@pytest.mark.parametrize("transform, hf_shapes, megatron_shape", [
    (QKVFusedPerGroup(), [(8, 8), (4, 8), (4, 8)], (16, 8)),
    (GateUpConcat(), [(12, 8), (12, 8)], (24, 8)),
    (VocabPad(), [(10, 8)], (16, 8)),
    (Identity(("hidden_size", "query_width")), [(8, 8)], (8, 8)),
    (Identity(("hidden_size", "ffn_hidden_size")), [(8, 12)], (8, 12)),
    (Norm(), [(8,)], (8,)),
    (QKVBiasFusedPerGroup(), [(8,), (4,), (4,)], (16,)),
    (HeadNorm(), [(2,)], (2,)),
])
def test_shapes_and_round_trip(transform, hf_shapes, megatron_shape):
    assert [tuple(s) for s in transform.hf_shapes(DIMS)] == hf_shapes
    assert tuple(transform.megatron_shape(DIMS)) == megatron_shape
    gen = torch.Generator().manual_seed(0)
    hf = [torch.randn(s, generator=gen) for s in hf_shapes]
    mg = transform.to_megatron(hf, DIMS)
    assert tuple(mg.shape) == megatron_shape
    back = transform.to_hf(mg, DIMS)
    assert len(back) == len(hf) and all(torch.equal(a, b) for a, b in zip(back, hf))
    assert all(t.is_contiguous() for t in back)


def test_qkv_bias_is_fused_like_the_weight_rows():
    """Qwen2's bias entry of each fused row is the bias of that row's HF projection."""
    d = 2
    dims = Dims(num_layers=1, hidden_size=3, ffn_hidden_size=1, num_attention_heads=HEADS,
                num_query_groups=KV_HEADS, head_dim=d, vocab_size=1, padded_vocab_size=1)
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n * d, 3, generator=gen) for n in (HEADS, KV_HEADS, KV_HEADS)]
    biases = [torch.randn(n * d, generator=gen) for n in (HEADS, KV_HEADS, KV_HEADS)]
    fused_w = QKVFusedPerGroup().to_megatron(weights, dims)
    fused_b = QKVBiasFusedPerGroup().to_megatron(biases, dims)
    x = torch.randn(3, generator=gen)
    hf_out = torch.cat([w @ x + b for w, b in zip(weights, biases)])
    megatron_out = fused_w @ x + fused_b
    # the same outputs, permuted the same way: un-fusing Megatron's output gives HF's
    back = QKVBiasFusedPerGroup().to_hf(megatron_out, dims)
    assert torch.allclose(torch.cat(back), hf_out)


def test_family_mappings_follow_the_qkv_entry():
    from megatron_endprompt.conversion.mapping import model_mappings

    assert model_mappings() == LLAMA_MAPPINGS
    qwen2 = [m.megatron for m in model_mappings(qkv_bias=True)]
    qwen3 = [m.megatron for m in model_mappings(qk_norm=True)]
    i = qwen2.index("decoder.layers.{layer}.self_attention.linear_qkv.weight")
    assert qwen2[i + 1] == "decoder.layers.{layer}.self_attention.linear_qkv.bias"
    assert qwen3[i + 1:i + 3] == ["decoder.layers.{layer}.self_attention.q_layernorm.weight",
                                  "decoder.layers.{layer}.self_attention.k_layernorm.weight"]


def test_vocab_padding_is_zero_rows():
    emb = torch.randn(10, 8)
    padded = VocabPad().to_megatron([emb], DIMS)
    assert torch.equal(padded[:10], emb) and not padded[10:].any()


def test_every_mapping_has_a_transform_object():
    kinds = {type(m.transform).__name__ for m in LLAMA_MAPPINGS}
    assert kinds == {"VocabPad", "Norm", "QKVFusedPerGroup", "Identity", "GateUpConcat"}


def test_conversion_does_not_import_training():
    """``conversion/`` sits after ``training/`` in the pipeline but needs none of it."""
    import pathlib

    import megatron_endprompt.conversion as pkg

    for path in pathlib.Path(pkg.__file__).parent.glob("*.py"):
        assert "megatron_endprompt.training" not in path.read_text(), path.name
