"""One model shape (megatron_endprompt.shape) behind conversion's Dims and HFModelSpec and the
planner's ModelSpec: the same checks and widths everywhere."""

from __future__ import annotations

import numpy as np
import pytest

from megatron_endprompt.conversion.hf_config import HFModelSpec
from megatron_endprompt.conversion.transforms import Dims
from megatron_endprompt.planning.presets import MODEL_PRESETS, ModelSpec
from megatron_endprompt.shape import ModelShape

SHAPE = dict(num_layers=2, hidden_size=64, ffn_hidden_size=176, num_attention_heads=4,
             num_query_groups=2, head_dim=16, vocab_size=100)


def test_widths_and_fields_shared():
    dims = Dims(**SHAPE, padded_vocab_size=128)
    spec = HFModelSpec(**SHAPE, rms_norm_eps=1e-5, rope_theta=5e5, max_position_embeddings=256)
    plan = ModelSpec(**SHAPE, name="tiny", original_window=256)
    for obj in (dims, spec, plan):
        assert isinstance(obj, ModelShape)
        assert (obj.query_width, obj.kv_width, obj.heads_per_group) == (64, 32, 2)
        assert obj.shape_fields() == {**SHAPE, "tied": False, "qkv_bias": False, "qk_norm": False}
    assert Dims(**spec.shape_fields(), padded_vocab_size=128) == dims
    llama3 = MODEL_PRESETS["llama3-8b"]
    assert (llama3.query_width, llama3.kv_width) == (4096, 1024)


@pytest.mark.parametrize("cls,extra", [
    (Dims, dict(padded_vocab_size=128)),
    (HFModelSpec, dict(rms_norm_eps=1e-5, rope_theta=1e4, max_position_embeddings=256)),
    (ModelSpec, dict(name="tiny")),
])
@pytest.mark.parametrize("bad,match", [
    (dict(num_query_groups=3), "not a multiple of the number of KV heads 3"),
    (dict(hidden_size=0), "hidden_size must be a positive integer"),
    (dict(num_layers=2.5), "num_layers must be a positive integer"),
    (dict(vocab_size=True), "vocab_size must be a positive integer"),
])
def test_every_spec_refuses_a_bad_shape(cls, extra, bad, match):
    with pytest.raises(ValueError, match=match):
        cls(**{**SHAPE, **bad}, **extra)


def test_numpy_ints_accepted_and_spec_checks_kept():
    ModelShape(**{**SHAPE, "num_layers": np.int64(2)})
    with pytest.raises(ValueError, match="model tiny: original_window"):
        ModelSpec(**SHAPE, name="tiny", original_window=0)
    with pytest.raises(ValueError, match="padded vocabulary 64 < vocabulary 100"):
        Dims(**SHAPE, padded_vocab_size=64)
