"""Megatron-Core version differences, in one place.

Everything here touches an API that moved between Megatron-Core releases (argument namespaces
of builders, private helpers we reuse). Tested against megatron-core 0.18.x-0.20 (the feature
table is :mod:`megatron_endprompt.runtime.versions`). Nothing here
changes torch or Megatron: patches live in :mod:`megatron_endprompt.runtime`.
"""

from __future__ import annotations

import argparse
from typing import Any

from megatron_endprompt.runtime.versions import tokenizer_namespace_extras


def build_megatron_tokenizer(
    tokenizer_type: str, tokenizer_model: str | None, vocab_size: int | None = None
) -> Any:
    """Build a tokenizer with Megatron-Core's own builder (``megatron.core.tokenizers``).

    The 0.19 builder reads a Megatron-LM argument namespace; we fill the fields it reads with
    Megatron-LM's defaults.
    """
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer

    args = argparse.Namespace(
        tokenizer_type=tokenizer_type,
        tokenizer_model=tokenizer_model,
        vocab_size=vocab_size,
        vocab_file=None,
        merge_file=None,
        special_tokens=None,
        chat_template=None,
        metadata_path=None,
        pad_vocab_size=False,
        tokenizer_hf_no_use_fast=False,
        tokenizer_hf_no_include_special_tokens=False,
        trust_remote_code=False,
        tokenizer_sentencepiece_ignore_extra_whitespaces=True,
        tokenizer_sentencepiece_legacy=False,
        tiktoken_pattern=None,
        tiktoken_num_special_tokens=1000,
        **tokenizer_namespace_extras(),
    )
    return build_tokenizer(args)


def supported_tokenizer_types() -> list[str]:
    """Tokenizer types Megatron-Core's builder accepts."""
    from megatron.core.tokenizers.utils.build_tokenizer import SUPPORTED_TOKENIZERS

    return [t for t in SUPPORTED_TOKENIZERS if "Multimodal" not in t and t != "SFTTokenizer"]


def build_document_index(documents, num_epochs: int, seed: int, separate_final_epoch: bool):
    """Megatron's epoch-shuffled document index (``gpt_dataset._build_document_index``), so our
    EndPrompt samples are shuffled exactly as ``GPTDataset`` shuffles documents."""
    import numpy
    from megatron.core.datasets.gpt_dataset import _build_document_index

    return _build_document_index(
        documents, num_epochs, numpy.random.RandomState(seed), separate_final_epoch
    )


def swiglu_sharded_factory(sh_ten: Any, sharded_offsets: Any, singleton_local_shards: bool, *,
                           tp_group: Any, dp_group: Any) -> Any:
    """Megatron's SwiGLU sharded factory (``mlp.apply_swiglu_sharded_factory``: a ``fc1``-like
    tensor saved as ``cat(gate, up)``). 0.19 takes the tensor- and data-parallel groups; 0.18
    reads them from ``parallel_state`` (the same groups in a run ``initialize_megatron`` built)."""
    import inspect

    from megatron.core.transformer.mlp import apply_swiglu_sharded_factory

    accepted = inspect.signature(apply_swiglu_sharded_factory).parameters
    groups = {name: group for name, group in (("tp_group", tp_group), ("dp_group", dp_group))
              if name in accepted}
    return apply_swiglu_sharded_factory(sh_ten, sharded_offsets, singleton_local_shards, **groups)
