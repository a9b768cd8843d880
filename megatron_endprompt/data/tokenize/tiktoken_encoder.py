"""The tiktoken path of preprocessing: :class:`TiktokenEncoder` and the id probe that admits it.

A byte-level BPE ``tokenizer.json`` that
:func:`~megatron_endprompt.data.tokenize.tiktoken_bpe.convert` accepts is encoded by ``tiktoken``
(~5x less CPU per token than HF ``tokenizers``), but only after :func:`probe_tiktoken` found the
same ids as Megatron's own tokenizer on the first documents and on :data:`STRESS_TEXTS` (digit runs,
contractions in both cases, whitespace and newline runs, scripts with combining marks, emoji
sequences, special-token literals). Either failure falls back to the HF path with one line saying
why. When a cached verdict (:mod:`~megatron_endprompt.data.tokenize.tokenizer_verdict`) says
``tokenizer.json`` alone is Megatron's tokenizer, "Megatron's" ids here are those of its
``tokenizers`` stand-in (:class:`~megatron_endprompt.data.tokenize.json_tokenizer.JsonTokenizer`),
and the line says so.

A vocabulary that lacks some single bytes still converts: each document whose UTF-8 holds one
(:func:`~megatron_endprompt.data.tokenize.tiktoken_bpe.missing_byte_finder`) is encoded by the HF
fast path instead (HF drops the byte, tiktoken cannot encode it); :attr:`TiktokenEncoder.slow_docs`
counts them for the summary.

Same guarantees as the HF fast path (:class:`~megatron_endprompt.data.tokenize.encode.FastEncoder`):
``--workers`` threads (tiktoken releases the GIL), documents longer than ``_CHUNK_CHARS``
encoded chunk by chunk at :func:`~megatron_endprompt.data.tokenize.encode.chunk_cuts` (bounded
memory, same ids), the post-processor's ids (Llama-3's ``<|begin_of_text|>``) put around each
document, EOD appended when asked. Lone surrogates are refused *before* tiktoken sees them
(it would silently replace them).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from megatron_endprompt.data.tokenize import encode
from megatron_endprompt.data.tokenize.tiktoken_bpe import convert, missing_byte_finder

#: Texts on which tiktoken and the HF engine are most likely to differ.
STRESS_TEXTS: tuple[str, ...] = (
    "1 12 123 1234 12345 1234567890123 3.14159 1,000,000 0x1F 2024-01-02",
    "I'm you're they'll we've he'd it's I'M YOU'RE THEY'LL WE'VE HE'D IT'S 'S 'T",
    "  two leading spaces, trailing spaces   ",
    "tabs\tand\t\ttabs\n\nnew\r\nlines\r\r\n\n\n  \n indented\n\t\n",
    "punctuation!!! ... ?!? (brackets) [x] {y} \"quotes\" 'single' -- — – … «»",
    "caf\u00e9 cafe\u0301 na\u00efve \u00c5ngstr\u00f6m \u1e9b\u0323 \ufb01ne",
    "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3002\u4e2d\u6587\u5b57\u7b26\u3002"
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0939\u093f\u0928\u094d\u0926\u0940 "
    "\u0e44\u0e17\u0e22 \u05e2\u05d1\u05e8\u05d9\u05ea \u0440\u0443\u0441\u0441\u043a\u0438\u0439",
    "emoji \U0001f642\U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467 "
    "\U0001f1eb\U0001f1f7 \u2764\ufe0f",
    "mixed123abc ABC123 a1b2c3 __init__ snake_case camelCase http://x.org/a?b=1&c=2",
    "\u00a0non-breaking\u2003em-space\u3000ideographic\u200bzero-width",
    "x" * 300 + " " + "9" * 50,
    "control \x00\x01\x07 esc \x1b[0m del \x7f nel \x85 bom \ufeff rare \U0010fffd \u07ff",
)


class TiktokenEncoder:
    """Megatron's ``HuggingFaceTokenizer.tokenize`` ids via ``tiktoken``, batched.

    ``backend``: the ``tokenizers.Tokenizer`` it was converted from (kept for the early-encode
    identity check); ``prefix``/``suffix``: the post-processor's ids around one text;
    ``eod``: appended to each document (``None``: nothing); ``workers``: threads;
    ``missing_bytes``: single bytes the vocabulary lacks (documents holding one are encoded by
    HF ``tokenizers``).
    """

    def __init__(self, backend, encoding, *, prefix: list[int], suffix: list[int],
                 eod: int | None, workers: int, missing_bytes: tuple[int, ...] = ()) -> None:
        self.backend, self.encoding = backend, encoding
        self.prefix, self.suffix = prefix, suffix
        self.eod, self.workers = eod, workers
        self.missing_bytes = missing_bytes
        self._holds_missing = missing_byte_finder(missing_bytes) if missing_bytes else None
        self._hf = encode.FastEncoder(backend, eod=eod) if missing_bytes else None
        self.slow_docs = 0
        """Documents encoded by HF ``tokenizers`` (they hold a byte the vocabulary lacks)."""
        self._pool = ThreadPoolExecutor(workers) if workers > 1 else None

    def _ids(self, text: str) -> np.ndarray:
        return self.encoding.encode_to_numpy(text, allowed_special="all")

    def _group(self, pieces: list[str]) -> list[np.ndarray]:
        return [self._ids(p) for p in pieces]

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """int32 ids of each text (``[prefix, text ids, suffix, eod?]``)."""
        for text in texts:
            if encode._SURROGATE.search(text):
                raise ValueError("lone surrogate")  # fast_encoded names the line
        if self._holds_missing is None:
            return self._encode(texts)
        slow = [k for k, text in enumerate(texts) if self._holds_missing(text)]
        if not slow:
            return self._encode(texts)
        self.slow_docs += len(slow)
        out: list[np.ndarray | None] = [None] * len(texts)
        for k, ids in zip(slow, self._hf.encode([texts[k] for k in slow])):
            out[k] = ids
        fast = [k for k in range(len(texts)) if out[k] is None]
        for k, ids in zip(fast, self._encode([texts[k] for k in fast])):
            out[k] = ids
        return out

    def _encode(self, texts: list[str]) -> list[np.ndarray]:
        pieces, owner = [], []
        for k, text in enumerate(texts):
            cuts = encode.chunk_cuts(text) if len(text) > encode._CHUNK_CHARS else [0, len(text)]
            for a, b in zip(cuts[:-1], cuts[1:]):
                pieces.append(text[a:b])
                owner.append(k)
        if self._pool is None or len(pieces) < 2:
            encoded = self._group(pieces)
        else:  # contiguous groups of about equal characters, one per thread
            total, groups, start, acc = sum(map(len, pieces)), [], 0, 0
            for i, p in enumerate(pieces):
                acc += len(p)
                if (acc >= total * (len(groups) + 1) / self.workers
                        and len(groups) < self.workers - 1):
                    groups.append((start, i + 1))
                    start = i + 1
            groups.append((start, len(pieces)))
            encoded = [ids for part in self._pool.map(
                self._group, [pieces[a:b] for a, b in groups]) for ids in part]
        per_text: list[list[np.ndarray]] = [[] for _ in texts]
        for k, ids in zip(owner, encoded):
            per_text[k].append(ids)
        head = np.asarray(self.prefix, np.int32)
        tail = np.asarray(self.suffix + ([] if self.eod is None else [self.eod]), np.int32)
        out = []
        for parts in per_text:
            n = len(head) + sum(map(len, parts)) + len(tail)
            arr = np.empty(n, np.int32)
            np.concatenate([head, *parts, tail], out=arr, casting="unsafe")
            out.append(arr)
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def tiktoken_encoder(backend, *, eod: int | None,
                     workers: int) -> tuple[TiktokenEncoder | None, str]:
    """``(encoder, what)`` for a ``tokenizers.Tokenizer`` that converts, else ``(None, why)``."""
    conv = convert(backend.to_str())
    if conv.encoding is None:
        return None, conv.reason
    with_sp = backend.encode("a", add_special_tokens=True).ids
    plain = backend.encode("a", add_special_tokens=False).ids
    k = next((i for i in range(len(with_sp) - len(plain) + 1)
              if with_sp[i : i + len(plain)] == plain), None)
    if k is None:
        return None, "the post-processor does not put ids around the text"
    return TiktokenEncoder(backend, conv.encoding, prefix=with_sp[:k],
                           suffix=with_sp[k + len(plain):], eod=eod, workers=workers,
                           missing_bytes=conv.missing_bytes), conv.reason


def probe_tiktoken(encoder: TiktokenEncoder, tokenizer, texts: list[str], *,
                   append_eod: bool) -> str | None:
    """``None`` if ``encoder`` gives Megatron's ids on ``texts`` + :data:`STRESS_TEXTS` + the
    added tokens' literals; else the first difference, for the path report."""
    specials = sorted(encoder.encoding.special_tokens_set)
    probe = [*texts, *STRESS_TEXTS]
    if specials:
        probe.append("x" + "y".join(specials) + "z " + " ".join(specials[:8]) + " <|not special|>")
    for text, ids in zip(probe, encoder.encode(probe)):
        want = list(tokenizer.tokenize(text)) + ([tokenizer.eod] if append_eod else [])
        if ids.tolist() != want:
            return f"tiktoken ids differ from Megatron's on {text[:40]!r}"
    return None
