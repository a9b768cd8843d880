"""The tests' tiny Megatron GPT as command-line flags: one builder instead of a hand-written
list per test file. The default is a tiny Llama (RMSNorm, SwiGLU, RoPE, GQA 4 heads / 2 groups,
untied embeddings, no biases, dropout off) on Megatron's ``NullTokenizer``; the keywords turn
off the parts a test must not have. ``megatron_endprompt.demo_train.TINY_LLAMA`` is the demo's
own model (4 layers, FFN 176) and stays there: the demo is a product, not a test."""

from __future__ import annotations


def tiny_llama_flags(*, seq_length: int = 64, vocab_size: int = 1000, layers: int | None = 2,
                     ffn_hidden_size: int = 128, gqa: bool = True, untied: bool = True,
                     dropout_off: bool = True, null_tokenizer: bool = True) -> list[str]:
    """Flags of a hidden-64 Llama with ``layers`` layers (``None``: no ``--num-layers``, for
    runs whose layer count comes from ``--hybrid-layer-pattern``), ``--seq-length`` and
    ``--max-position-embeddings`` both ``seq_length``."""
    flags = [*(["--num-layers", str(layers)] if layers is not None else []),
             "--hidden-size", "64", "--ffn-hidden-size", str(ffn_hidden_size),
             "--num-attention-heads", "4",
             *(["--group-query-attention", "--num-query-groups", "2"] if gqa else []),
             "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
             "--disable-bias-linear",
             *(["--untie-embeddings-and-output-weights"] if untied else []),
             *(["--attention-dropout", "0", "--hidden-dropout", "0"] if dropout_off else []),
             "--seq-length", str(seq_length), "--max-position-embeddings", str(seq_length)]
    if null_tokenizer:
        flags += ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab_size)]
    return flags
