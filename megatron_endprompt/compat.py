"""Megatron-Core version differences, in one place.

Everything here touches an API that moved between Megatron-Core releases (argument namespaces
of builders, private helpers we reuse). Tested against megatron-core 0.19.x.
"""

from __future__ import annotations

import argparse
from typing import Any


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


# --- RoPE / GPTModel internals (megatron_endprompt.model) ------------------------------------

#: Index of ``rotary_pos_emb`` in the tuple returned by ``GPTModel._preprocess`` (0.19:
#: ``(decoder_input, rotary_pos_emb, rotary_pos_cos, rotary_pos_sin, sequence_len_offset,
#: padding_mask[, rotary_pos_cos_sin])``).
GPT_PREPROCESS_ROTARY_INDEX = 1
#: Megatron-Core minor versions whose ``GPTModel._preprocess`` / rope_utils we have checked.
ROPE_CHECKED_MEGATRON_VERSIONS = ("0.19",)


def check_megatron_rope_version() -> None:
    """Fail loudly on a Megatron-Core whose GPTModel/RoPE internals we have not checked."""
    import megatron.core

    version = getattr(megatron.core, "__version__", "unknown")
    if not any(version.startswith(v + ".") for v in ROPE_CHECKED_MEGATRON_VERSIONS):
        raise RuntimeError(
            f"megatron-core {version} is not supported by megatron_endprompt.model (checked: "
            f"{', '.join(ROPE_CHECKED_MEGATRON_VERSIONS)}); GPTModel._preprocess and rope_utils "
            "must be re-checked and megatron_endprompt/compat.py updated"
        )


class stock_rope_skipped:  # noqa: N801 - used as a context manager
    """Make ``GPTModel._preprocess`` skip its own RoPE computation (0.19 branches on
    ``self.position_embedding_type``); restored on exit, exceptions included."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._saved: str | None = None

    def __enter__(self) -> None:
        self._saved = self._model.position_embedding_type
        self._model.position_embedding_type = "none"

    def __exit__(self, *exc: object) -> None:
        self._model.position_embedding_type = self._saved


def install_batched_freqs_fallback() -> None:
    """Route per-row RoPE freqs ``[S, B, 1, D]`` (B > 1) to Megatron's unfused kernel when
    ``apply_rope_fusion`` is on: TE's fused RoPE takes only ``[S, 1, 1, D]``. Shared-layout
    freqs ``[S, 1, 1, D]`` still reach TE. Patches the module global that 0.19's
    ``rope_utils.apply_rotary_pos_emb`` reads; idempotent."""
    from megatron.core.models.common.embeddings import rope_utils

    fused = rope_utils.fused_apply_rotary_pos_emb
    if fused is None or getattr(fused, "_endprompt_fallback", False):
        return

    def fused_or_unfused(t: Any, freqs: Any, *args: Any, **kwargs: Any) -> Any:
        if freqs.dim() == 4 and freqs.shape[1] > 1:
            return rope_utils._apply_rotary_pos_emb_bshd(
                t, freqs, rotary_interleaved=kwargs.get("interleaved", False)
            )
        return fused(t, freqs, *args, **kwargs)

    fused_or_unfused._endprompt_fallback = True  # type: ignore[attr-defined]
    rope_utils.fused_apply_rotary_pos_emb = fused_or_unfused


def quiet_megatron_import_noise() -> None:
    """Silence import-time chatter that is not actionable for our users: Megatron's 'TE/Apex
    not installed, falling back' warnings and torch's 'No CUDA runtime' log line on CPU."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
    warnings.filterwarnings("ignore", message=".*Could not determine rank from torch.distributed.*")
    warnings.filterwarnings("ignore", message=".*absl.logging is not installed.*")
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


# --- checkpoint conversion (megatron_endprompt.conversion) -----------------------------------


class cpu_checkpoint_io:  # noqa: N801 - used as a context manager
    """Let ``dist_checkpointing.save/load`` run in a process without CUDA.

    0.19's filesystem writer calls ``torch.cuda.synchronize()`` before copying tensors to the
    host and allocates its failure flag on ``torch.cuda.current_device()``, unconditionally;
    without a driver both raise. When CUDA is unavailable they become a no-op and ``"cpu"``
    for the duration (every tensor is on the CPU). Restored on exit; does nothing when CUDA is
    available.
    """

    def __init__(self) -> None:
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> None:
        import torch

        if torch.cuda.is_available():
            return

        def synchronize(device: Any = None) -> None:
            """No CUDA device: nothing to synchronise."""

        def current_device() -> str:
            """No CUDA device: tensors Megatron puts on the "current device" go to the CPU."""
            return "cpu"

        for name, repl in (("synchronize", synchronize), ("current_device", current_device)):
            self._saved[name] = getattr(torch.cuda, name)
            setattr(torch.cuda, name, repl)

    def __exit__(self, *exc: object) -> None:
        import torch

        for name, original in self._saved.items():
            setattr(torch.cuda, name, original)
        self._saved = {}
