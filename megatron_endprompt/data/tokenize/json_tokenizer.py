"""Megatron's ``HuggingFaceTokenizer`` computed from ``tokenizer.json`` with ``tokenizers`` alone.

Building Megatron's tokenizer imports torch, Megatron-Core and transformers (~6 CPU-s), most of
a preprocessing run on a small corpus. :class:`JsonTokenizer` offers what preprocessing, the
sidecar and ``inspect`` read of it (``vocab_size``, ``eod``, ``tokenize``, the id -> token
table, ``detokenize``), from the ``tokenizers.Tokenizer`` of the directory's ``tokenizer.json``:

* ``tokenize(text)``: ``backend.encode(text, add_special_tokens=True).ids`` (Megatron's default
  ``include_special_tokens``: ``hf_tokenizer(text).input_ids``);
* ``vocab_size``: ``backend.get_vocab_size(with_added_tokens=True)`` (``len(hf_tokenizer)``);
* ``eod``: the id of the ``eos_token`` named by ``tokenizer_config.json`` /
  ``special_tokens_map.json`` (:func:`config_eos_token`), ``None`` when neither names one.

It is used in place of Megatron's tokenizer only where
:mod:`~megatron_endprompt.data.tokenize.tokenizer_verdict` has found both equal (identity and ids)
for the same files and library versions; ``inspect`` uses it when the recorded vocabulary
fingerprint matches.
"""

from __future__ import annotations

import json
import os
from typing import Any

#: Files that may name the special tokens, in the order transformers merges them (later wins).
_SPECIAL_FILES = ("tokenizer_config.json", "special_tokens_map.json")


def config_eos_token(directory: str) -> str | None:
    """The ``eos_token`` string the directory's configuration names, or ``None`` when none
    does or the files disagree (then only Megatron's tokenizer can say)."""
    found = set()
    for name in _SPECIAL_FILES:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                value = json.load(f).get("eos_token")
        except (OSError, ValueError, AttributeError):
            return None
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            found.add(value)
    return found.pop() if len(found) == 1 else None


class JsonTokenizer:
    """Megatron ``HuggingFaceTokenizer``'s ids, identity and text from a ``tokenizers.Tokenizer``.

    ``backend``: the loaded ``tokenizer.json``; ``vocab_size``: the id count (default: the
    backend's, added tokens included); ``eod``: the end-of-document id (``None``: unknown).
    """

    def __init__(self, backend: Any, *, vocab_size: int | None = None,
                 eod: int | None = None) -> None:
        self.backend = backend
        self.vocab_size = (backend.get_vocab_size(with_added_tokens=True)
                           if vocab_size is None else int(vocab_size))
        self.eod = eod

    @classmethod
    def from_directory(cls, directory: str, backend: Any = None) -> JsonTokenizer:
        """The directory's ``tokenizer.json`` (or the given ``backend`` loaded from it), with
        the EOD its configuration names."""
        if backend is None:
            from tokenizers import Tokenizer

            backend = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
        eos = config_eos_token(directory)
        return cls(backend, eod=None if eos is None else backend.token_to_id(eos))

    def tokenize(self, text: str) -> list[int]:
        """Megatron's ``tokenize``: the post-processor's special tokens included."""
        return self.backend.encode(text, add_special_tokens=True).ids

    def encode_plain(self, text: str) -> list[int]:
        """No special token added (``hf.encode(text, add_special_tokens=False)``)."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        return [self.backend.id_to_token(int(i)) for i in ids]

    def detokenize(self, ids: list[int]) -> str:
        tokens = [t for t in self.ids_to_tokens(ids) if t is not None]
        decoder = self.backend.decoder
        return decoder.decode(tokens) if decoder is not None else " ".join(tokens)
