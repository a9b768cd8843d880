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
