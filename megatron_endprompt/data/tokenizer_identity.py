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


def tokenizer_identity(tokenizer: Any, *, tokenizer_type: str | None = None,
                       tokenizer_model: str | None = None, fingerprint: bool = True) -> dict:
    """``{tokenizer_type, tokenizer_model, vocab_size, eod, fingerprint}`` of a Megatron
    tokenizer; the fingerprint (~0.1 s for 128K tokens) is memoised on the object, and left
    ``None`` with ``fingerprint=False`` (ranks other than rank 0 compare size and EOD only:
    every rank builds its tokenizer from the same flags)."""
    eod = getattr(tokenizer, "eod", None)
    identity = {"tokenizer_type": tokenizer_type, "tokenizer_model": tokenizer_model,
                "vocab_size": int(tokenizer.vocab_size), "eod": None if eod is None else int(eod),
                "fingerprint": None}
    if fingerprint:
        memo = getattr(tokenizer, _MEMO_ATTR, None)
        if memo is None:
            memo = vocab_fingerprint(tokenizer)
            try:
                setattr(tokenizer, _MEMO_ATTR, memo)
            except AttributeError:
                pass
        identity["fingerprint"] = memo
    return identity


def describe(identity: dict) -> str:
    """``HuggingFaceTokenizer /path (vocab 128256, eod 128001, vocab sha256 1a2b3c4d5e6f)``."""
    name = " ".join(str(x) for x in (identity.get("tokenizer_type"),
                                     identity.get("tokenizer_model")) if x) or "tokenizer"
    fp = identity.get("fingerprint") or "?"
    return (f"{name} (vocab {identity.get('vocab_size')}, eod {identity.get('eod')}, "
            f"vocab sha256 {fp[:12]})")


def same_tokenizer(recorded: dict, current: dict) -> bool:
    """Whether ``current`` produces the ids ``recorded`` describes: vocabulary size, EOD id
    and (when ``current`` has one) the vocabulary fingerprint."""
    keys = ("vocab_size", "eod") + (("fingerprint",) if current.get("fingerprint") else ())
    return all(recorded.get(k) == current.get(k) for k in keys)


def is_known(identity: dict) -> bool:
    """A sidecar made without a tokenizer (e.g. for an existing corpus) records none."""
    return bool(identity) and identity.get("fingerprint") is not None
