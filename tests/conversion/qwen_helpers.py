"""Tiny random Qwen2 (QKV bias) and Qwen3 (QK-norm) HF models built offline for the conversion
tests."""

from __future__ import annotations

import torch
from conversion_helpers import EPS, FFN, HEADS, HIDDEN, KV_HEADS, VOCAB, WINDOW

#: Qwen3's head_dim (32) differs from hidden/heads (16): the q/k norms and o_proj then have
#: shapes a mapping mix-up cannot pass. Qwen's RoPE base 1e6.
QWEN_THETA, QWEN3_HEAD_DIM, QWEN_LAYERS = 1000000.0, 32, 2


def make_qwen_model(out_dir: str, model_type: str, *, seed: int = 0, **overrides) -> str:
    """Random ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` saved (sharded safetensors)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_class, model_class = {"qwen2": (Qwen2Config, Qwen2ForCausalLM),
                                 "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[model_type]
    fields = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN,
                  num_hidden_layers=QWEN_LAYERS, num_attention_heads=HEADS,
                  num_key_value_heads=KV_HEADS, max_position_embeddings=WINDOW,
                  rms_norm_eps=EPS, rope_parameters={"rope_type": "default",
                                                     "rope_theta": QWEN_THETA},
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    if model_type == "qwen3":
        fields["head_dim"] = QWEN3_HEAD_DIM
    fields.update(overrides)
    torch.manual_seed(seed)
    model = model_class(config_class(**fields))
    with torch.no_grad():
        for name, p in model.named_parameters():  # O(1) logits; biases and norms matter
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.1)
    model.save_pretrained(out_dir, max_shard_size="200KB")
    return out_dir

