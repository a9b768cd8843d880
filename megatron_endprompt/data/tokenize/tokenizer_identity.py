"""Which tokenizer made a dataset: recorded in the sidecar, compared at pretrain start.

Why: token ids mean nothing without their tokenizer. Training on data made with another
tokenizer either runs silently on garbage (ids < vocab) or crashes in the embedding (ids >=
vocab). The identity is what decides whether two tokenizers produce the same ids:

* ``vocab_size`` and ``eod`` (Megatron's ``tokenizer.vocab_size`` / ``tokenizer.eod``);
* ``fingerprint``: SHA-256 of the id -> token-string table for every id (so two copies of one
  tokenizer at different paths agree, and a retrained vocabulary of the same size does not);
* ``tokenizer_type`` / ``tokenizer_model``: informative only (named in the error message).

The fingerprint is computed from the tokenizer object Megatron builds (the same builder for
preprocessing and training), never from file bytes, so re-saved files with the same
vocabulary still match.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

_MEMO_ATTR = "_endprompt_identity"


def id_to_token_table(tokenizer: Any) -> list | None:
    """Token string of every id ``0..vocab_size-1``; ``None`` when the tokenizer has no table
    (``NullTokenizer``: the ids are the tokens). Megatron's wrapper keeps the library
    tokenizer in ``_tokenizer`` (which has ``ids_to_tokens``)."""
    n = int(tokenizer.vocab_size)
    lib = getattr(tokenizer, "_tokenizer", None)
    if "NullTokenizer" in type(lib).__name__ or "NullTokenizer" in type(tokenizer).__name__:
        return None
    for obj in (lib, tokenizer):
        convert = getattr(obj, "ids_to_tokens", None) if obj is not None else None
        if convert is None:
            continue
        try:
            return list(convert(list(range(n))))
        except Exception:  # holes in the id space, or no table at all
            continue
    try:
        vocab = tokenizer.vocab
    except Exception:
        return None
    if isinstance(vocab, dict):
        return [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    return list(vocab) if vocab is not None else None


def vocab_fingerprint(tokenizer: Any) -> str:
    """SHA-256 (hex) of the id -> token table (JSON), or of the library class and size for a
    tokenizer without a table."""
    table = id_to_token_table(tokenizer)
    if table is None:
        lib = getattr(tokenizer, "_tokenizer", tokenizer)
        table = [f"<{type(lib).__name__}:{int(tokenizer.vocab_size)}>"]
    blob = json.dumps([t if isinstance(t, str) or t is None else repr(t) for t in table],
                      ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


ID_KEYS: tuple[str, ...] = ("vocab_size", "eod", "fingerprint")
"""The fields that decide the ids (the type and model path are informative only)."""


@dataclass(frozen=True, kw_only=True)
class TokenizerIdentity:
    """Which tokenizer made (or reads) the ids; :meth:`as_dict` is its on-disk form (sidecar
    headers, the tokenizer verdict cache), :meth:`from_dict` reads it back, old files included."""

    tokenizer_type: str | None = None
    """``--tokenizer-type`` (informative: named in messages)."""
    tokenizer_model: str | None = None
    """``--tokenizer-model`` (informative: copies at other paths are the same tokenizer)."""
    vocab_size: int | None = None
    """Megatron's ``tokenizer.vocab_size`` (unpadded)."""
    eod: int | None = None
    """Megatron's ``tokenizer.eod``."""
    fingerprint: str | None = None
    """SHA-256 of the id -> token table (:func:`vocab_fingerprint`); ``None`` for a cheap
    identity (ranks other than 0: the same flags build the same tokenizer)."""

    def as_dict(self) -> dict:
        """The on-disk form: ``{tokenizer_type, tokenizer_model, vocab_size, eod,
        fingerprint}``, in that order (byte-identical headers)."""
        return {"tokenizer_type": self.tokenizer_type, "tokenizer_model": self.tokenizer_model,
                "vocab_size": self.vocab_size, "eod": self.eod, "fingerprint": self.fingerprint}

    def ids_part(self) -> dict:
        """Only the fields that decide the ids (:data:`ID_KEYS`)."""
        return {k: getattr(self, k) for k in ID_KEYS}

    @classmethod
    def from_dict(cls, data: dict | None) -> TokenizerIdentity | None:
        """The identity a header or cache entry records; ``None`` when it records none (``{}``:
        a sidecar built without a tokenizer). Missing keys read as ``None``."""
        if not data:
            return None
        return cls(**{k: data.get(k) for k in ("tokenizer_type", "tokenizer_model",
                                                 "vocab_size", "eod", "fingerprint")})

    @property
    def is_known(self) -> bool:
        """Whether it can be checked: it has a vocabulary fingerprint."""
        return self.fingerprint is not None

    def difference(self, current: TokenizerIdentity) -> str | None:
        """The one matching rule: ``None`` when ``current`` produces the ids ``self``
        describes (same vocabulary size, EOD id, and — unless ``current`` is a cheap identity
        without one — vocabulary fingerprint), else the first field that differs, as
        ``"FIELD MINE differs from THEIRS"``."""
        for key in ID_KEYS:
            if key == "fingerprint" and current.fingerprint is None:
                continue
            if getattr(self, key) != getattr(current, key):
                return f"{key} {getattr(self, key)} differs from {getattr(current, key)}"
        return None

    def matches(self, current: TokenizerIdentity) -> bool:
        """:meth:`difference` is ``None``."""
        return self.difference(current) is None

    def describe(self) -> str:
        """``HuggingFaceTokenizer /path (vocab 128256, eod 128001, vocab sha256 1a2b3c4d5e6f)``."""
        name = " ".join(str(x) for x in (self.tokenizer_type, self.tokenizer_model) if x) \
            or "tokenizer"
        fp = self.fingerprint or "?"
        return (f"{name} (vocab {self.vocab_size}, eod {self.eod}, "
                f"vocab sha256 {fp[:12]})")


def tokenizer_identity(tokenizer: Any, *, tokenizer_type: str | None = None,
                       tokenizer_model: str | None = None,
                       fingerprint: bool = True) -> TokenizerIdentity:
    """The :class:`TokenizerIdentity` of a Megatron tokenizer; the fingerprint (~0.1 s for 128K
    tokens) is memoised on the object, and left ``None`` with ``fingerprint=False`` (ranks
    other than rank 0 compare size and EOD only: every rank builds its tokenizer from the same
    flags)."""
    eod = getattr(tokenizer, "eod", None)
    memo = None
    if fingerprint:
        memo = getattr(tokenizer, _MEMO_ATTR, None)
        if memo is None:
            memo = vocab_fingerprint(tokenizer)
            try:
                setattr(tokenizer, _MEMO_ATTR, memo)
            except AttributeError:
                pass
    return TokenizerIdentity(tokenizer_type=tokenizer_type, tokenizer_model=tokenizer_model,
                             vocab_size=int(tokenizer.vocab_size),
                             eod=None if eod is None else int(eod), fingerprint=memo)
