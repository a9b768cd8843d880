"""Tiny Hugging Face ``LlamaConfig``s, built in one place: ``tiny_llama_config`` for a random
model a test saves and loads (evaluation, the reliability sweep, conversion), ``rope_config``
for a ``LlamaRotaryEmbedding`` alone (two heads of ``head_dim``, no weights made), and
``llama_config_from_flags`` for the HF twin of a Megatron flag list. ``transformers`` is
imported inside each function: importing this module costs nothing."""

from __future__ import annotations


def tiny_llama_config(*, vocab_size: int, **fields):
    """A 2-layer, hidden-32 Llama (4 heads, 2 KV heads, FFN 64, 256 positions, untied
    embeddings); ``fields`` override or add any ``LlamaConfig`` field."""
    from transformers import LlamaConfig

    base = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=256, tie_word_embeddings=False)
    return LlamaConfig(**{**base, **fields})


def rope_config(*, head_dim: int, max_position_embeddings: int, rope_parameters: dict):
    """The config a ``LlamaRotaryEmbedding`` reads: head dim ``head_dim`` (two heads), the
    given ``rope_parameters`` (``rope_type``, ``rope_theta``, ``factor``, ...)."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                       max_position_embeddings=max_position_embeddings,
                       rope_parameters=rope_parameters)


def _flag(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


def llama_config_from_flags(flags: list[str], *, vocab_size: int, max_position_embeddings: int,
                            rms_norm_eps: float = 1e-5):
    """The HF Llama a Megatron Llama flag list (``--num-layers``, ``--hidden-size``,
    ``--ffn-hidden-size``, ``--num-attention-heads``, ``--num-query-groups``,
    ``--rotary-base``) describes, untied, default RoPE."""
    from transformers import LlamaConfig

    heads, hidden = int(_flag(flags, "--num-attention-heads")), int(_flag(flags, "--hidden-size"))
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden,
        intermediate_size=int(_flag(flags, "--ffn-hidden-size")),
        num_hidden_layers=int(_flag(flags, "--num-layers")), num_attention_heads=heads,
        num_key_value_heads=int(_flag(flags, "--num-query-groups")),
        head_dim=hidden // heads, max_position_embeddings=max_position_embeddings,
        rms_norm_eps=rms_norm_eps,
        rope_parameters={"rope_type": "default",
                         "rope_theta": float(_flag(flags, "--rotary-base"))},
        tie_word_embeddings=False)
