"""Tokenizers for preprocessing, built by Megatron-Core's own builders.

``TokenizerSpec`` is what gets pickled to worker processes and recorded in the sidecar; each
worker builds its tokenizer once from it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from megatron_endprompt.compat import build_megatron_tokenizer, supported_tokenizer_types
from megatron_endprompt.data.tokenize.json_tokenizer import JsonTokenizer
from megatron_endprompt.data.tokenize.tokenizer_identity import TokenizerIdentity, vocab_fingerprint
from megatron_endprompt.errors import UserError

_NEEDS_FILE = {"SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer",
               "TikTokenizer"}


@dataclass(frozen=True, kw_only=True)
class TokenizerSpec:
    """How to build the tokenizer (Megatron's ``--tokenizer-type`` / ``--tokenizer-model``)."""

    tokenizer_type: str
    """Megatron tokenizer type, e.g. ``HuggingFaceTokenizer`` (Llama-3),
    ``GPTSentencePieceTokenizer``."""

    tokenizer_model: str | None = None
    """Model file (SentencePiece/TikToken) or HF directory/name; unused by ``NullTokenizer``."""

    vocab_size: int | None = None
    """Vocabulary size for ``NullTokenizer`` (token ids are the whitespace-separated integers)."""

    def as_dict(self) -> dict:
        """For the sidecar header."""
        return asdict(self)


def check_tokenizer_spec(spec: TokenizerSpec) -> None:
    """Refuse an unknown type or an unreadable model path before any worker starts."""
    types = supported_tokenizer_types()
    if spec.tokenizer_type not in types:
        raise UserError(
            f"--tokenizer-type {spec.tokenizer_type} is not supported; "
            f"use one of {', '.join(types)}"
        )
    if spec.tokenizer_type == "NullTokenizer":
        if not spec.vocab_size:
            raise UserError("--tokenizer-type NullTokenizer needs --vocab-size")
        return
    path = spec.tokenizer_model
    if not path:
        raise UserError(f"--tokenizer-type {spec.tokenizer_type} needs --tokenizer-model PATH")
    if spec.tokenizer_type in _NEEDS_FILE and not (os.path.isfile(path)
                                                   and os.access(path, os.R_OK)):
        raise UserError(
            f"--tokenizer-model {path}: not a readable file; point it to the tokenizer model file"
        )
    if spec.tokenizer_type == "HuggingFaceTokenizer" and not os.path.exists(path):
        raise UserError(
            f"--tokenizer-model {path}: no such directory; point it to a local Hugging Face "
            "tokenizer directory (this machine cannot download from a hub)"
        )


def build_tokenizer(spec: TokenizerSpec) -> Any:
    """Megatron-Core tokenizer for ``spec``; one-line ``UserError`` when it cannot be loaded."""
    check_tokenizer_spec(spec)
    try:
        return build_megatron_tokenizer(spec.tokenizer_type, spec.tokenizer_model, spec.vocab_size)
    except Exception as exc:  # the libraries raise anything from OSError to RuntimeError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(
            f"--tokenizer-model {spec.tokenizer_model}: cannot load a {spec.tokenizer_type} "
            f"({first[:200]}); check the path and --tokenizer-type"
        ) from None


def hf_tokenizer_of(tokenizer: Any) -> Any | None:
    """The ``transformers`` tokenizer inside a Megatron ``HuggingFaceTokenizer`` (else ``None``)."""
    hf = getattr(getattr(tokenizer, "_tokenizer", None), "tokenizer", None)
    return hf if hasattr(hf, "encode") and hasattr(hf, "convert_tokens_to_ids") else None


def encode_plain(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` with *no* special token added around it.

    Megatron's ``HuggingFaceTokenizer.tokenize`` runs the HF post-processor, which for Llama-3
    puts ``<|begin_of_text|>`` before every string: right for a document, wrong for a piece of
    text spliced into a sample (a terminal prompt would carry an attention-sink BOS at
    position ``L - b``). Special-token *strings* in ``text`` (``<|eot_id|>``) still map to
    their single ids. SentencePiece and TikToken libraries add nothing, so their
    ``tokenize`` is used as is.
    """
    if isinstance(tokenizer, JsonTokenizer):
        return list(tokenizer.encode_plain(text))
    hf = hf_tokenizer_of(tokenizer)
    if hf is not None:
        return list(hf.encode(text, add_special_tokens=False))
    return list(tokenizer.tokenize(text))


def token_text(tokenizer: Any, token_id: int) -> str | None:
    """The vocabulary string of ``token_id`` (for summaries), or ``None`` when unknown."""
    hf = hf_tokenizer_of(tokenizer)
    try:
        if hf is not None:
            return hf.convert_ids_to_tokens(int(token_id))
        return tokenizer.ids_to_tokens([int(token_id)])[0] if hasattr(
            tokenizer, "ids_to_tokens") else None
    except Exception:  # noqa: BLE001 - a summary nicety only
        return None


def json_detokenizer(recorded: TokenizerIdentity) -> JsonTokenizer | None:
    """A :class:`~megatron_endprompt.data.tokenize.json_tokenizer.JsonTokenizer` (what Megatron's
    ``HuggingFaceTokenizer.detokenize`` does, without importing torch, Megatron-Core and
    transformers: ~4 s of CPU) for a recorded ``HuggingFaceTokenizer`` identity whose
    directory still holds a ``tokenizer.json`` with the same vocabulary fingerprint; else
    ``None`` (the caller builds Megatron's tokenizer)."""
    model = recorded.tokenizer_model
    path = os.path.join(model, "tokenizer.json") if model else ""
    if recorded.tokenizer_type != "HuggingFaceTokenizer" or not os.path.isfile(path) \
            or not recorded.fingerprint or not recorded.vocab_size:
        return None
    try:
        from tokenizers import Tokenizer

        light = JsonTokenizer(Tokenizer.from_file(path), vocab_size=int(recorded.vocab_size))
    except Exception:  # noqa: BLE001 - a file only transformers reads: Megatron's path decides
        return None
    return light if vocab_fingerprint(light) == recorded.fingerprint else None
