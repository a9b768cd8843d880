"""The SentencePiece batch path of preprocessing: :class:`SpmEncoder` and the probe that admits it.

Why: Megatron-Core's ``SentencePieceTokenizer``, ``GPTSentencePieceTokenizer`` and
``Llama2Tokenizer`` (all three built on one wrapper, ``legacy=False``, no added special tokens,
``ignore_extra_whitespaces=True``: Megatron-LM's defaults) tokenize a document as
``SentencePieceProcessor.encode_as_ids(text)``: no BOS, no EOS, special-token strings such as
``<s>`` encoded as plain text, user-defined symbols matched by the library itself; EOD is
``eos_id``. Megatron-LM's ``preprocess_data.py`` calls it once per document in ``--workers``
processes and pickles the ids back. The same library encodes a *list* of texts on
``num_threads`` C++ threads in one call and returns int32 buffers, with the same processor and
so the same ids: no per-document Python call, no pickling.

Used only when the wrapper's ``tokenize`` is that plain call (:func:`spm_processor` says why not
otherwise, and the per-document pool runs), and only after :func:`probe_spm` found Megatron's
ids on the first documents and on :data:`SPM_STRESS_TEXTS`. Documents longer than
``encode._CHUNK_CHARS`` are cut like the byte-level paths' long lines (bounded memory, threads
busy), but only at a single space between two ASCII word characters, and only for a model
whose normalizer adds the dummy prefix and whose pieces never hold ``▁`` past their first
character unless made of ``▁`` only (:func:`cut_safe`): there SentencePiece starts a piece at every
space, and the dummy prefix of the next chunk is that space, so the chunks' ids are the whole
text's.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from megatron_endprompt.data.tokenize import encode
from megatron_endprompt.data.tokenize.tiktoken_encoder import STRESS_TEXTS

#: Texts on which a batched and a per-document SentencePiece call could plausibly differ.
SPM_STRESS_TEXTS: tuple[str, ...] = (
    "<s> </s> <unk> <pad> [INST] hello [/INST] <|endoftext|> <0x41>",
    "  leading and trailing  spaces   inside  ",
    "\u2581already a separator\u2581\u2581 here",
    "tabs\tnew\nlines\r\n\n\nform\x0cfeed",
    "",
    " ",
)
_ASCII_CUT = re.compile(r"(?<=[A-Za-z0-9.,;:!?'\")\]]) (?=[A-Za-z0-9])")


def spm_processor(tokenizer: Any) -> tuple[Any | None, str]:
    """``(processor, what)``: the ``SentencePieceProcessor`` behind a Megatron SentencePiece
    tokenizer whose ``tokenize`` is its plain ``encode_as_ids``, else ``(None, why)``."""
    lib = getattr(tokenizer, "_tokenizer", tokenizer)
    proc = getattr(lib, "tokenizer", None)
    if proc is None or type(proc).__name__ != "SentencePieceProcessor":
        return None, "not a SentencePiece tokenizer"
    if getattr(lib, "legacy", False) and getattr(lib, "special_token_to_id", None):
        return None, "legacy wrapper with added special tokens (matched in Python per document)"
    if getattr(lib, "removed_extra_spaces", False) and \
            not getattr(lib, "ignore_extra_whitespaces", True):
        return None, "extra-whitespace markers inserted in Python per document"
    return proc, "SentencePiece encode of a batch on --workers C++ threads"


def cut_safe(proc: Any) -> bool:
    """Whether long texts may be cut at single spaces (see the module docstring)."""
    try:
        from sentencepiece import sentencepiece_model_pb2 as pb2

        model = pb2.ModelProto()
        model.ParseFromString(proc.serialized_model_proto())
    except Exception:  # noqa: BLE001 - no protobuf: never cut
        return False
    norm, trainer = model.normalizer_spec, model.trainer_spec
    if not norm.add_dummy_prefix or trainer.treat_whitespace_as_suffix or \
            not trainer.split_by_whitespace:
        return False
    # a whitespace-only piece ("▁▁", Llama-2's) never spans a single space between words
    return not any("\u2581" in p.piece[1:] and p.piece.strip("\u2581") for p in model.pieces)


def _cuts(text: str) -> list[int]:
    """Cut points: the space itself is dropped (``[a, space)``, ``[space + 1, b)``)."""
    cuts = [0]
    while True:
        m = _ASCII_CUT.search(text, cuts[-1] + encode._CHUNK_CHARS)
        if m is None:
            break
        cuts.append(m.start())
    cuts.append(len(text))
    return cuts


class SpmEncoder:
    """Megatron's SentencePiece ``tokenize`` ids of many texts in one C++ call per batch.

    ``proc``: the ``SentencePieceProcessor``; ``eod``: appended to each document (``None``:
    nothing); ``workers``: C++ threads; ``chunkable``: long texts may be cut (:func:`cut_safe`).
    """

    def __init__(self, proc: Any, *, eod: int | None, workers: int, chunkable: bool) -> None:
        self.proc, self.eod, self.workers, self.chunkable = proc, eod, workers, chunkable
        self.backend = None  # early encoding (tokenizer.json) never adopts this encoder

    def _batch(self, texts: list[str]) -> list[np.ndarray]:
        try:
            return self.proc.encode(texts, num_threads=self.workers, return_type="numpy")
        except (TypeError, ValueError):  # an older sentencepiece: lists of ints
            return [np.asarray(ids, np.int32) for ids in
                    self.proc.encode(texts, num_threads=self.workers)]

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """int32 ids of each text (EOD appended when asked)."""
        pieces, owner = [], []
        for k, text in enumerate(texts):
            if encode._SURROGATE.search(text):
                raise ValueError("lone surrogate")  # fast_encoded names the line
            cuts = _cuts(text) if self.chunkable and len(text) > encode._CHUNK_CHARS \
                else [0, len(text)]
            for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
                pieces.append(text[a + (i > 0) : b])  # the space at a cut is the dummy prefix
                owner.append(k)
        encoded = self._batch(pieces) if pieces else []
        per_text: list[list[np.ndarray]] = [[] for _ in texts]
        for k, ids in zip(owner, encoded):
            per_text[k].append(ids)
        tail = np.asarray([] if self.eod is None else [self.eod], np.int32)
        out = []
        for parts in per_text:
            if len(parts) == 1 and self.eod is None:
                out.append(np.asarray(parts[0], np.int32))
                continue
            arr = np.empty(sum(map(len, parts)) + len(tail), np.int32)
            np.concatenate([*parts, tail], out=arr, casting="unsafe")
            out.append(arr)
        return out


def probe_spm(encoder: SpmEncoder, tokenizer: Any, texts: list[str], *,
              append_eod: bool) -> str | None:
    """``None`` if ``encoder`` gives Megatron's ``tokenize`` ids (+ EOD) on ``texts`` and
    :data:`SPM_STRESS_TEXTS`, else the first difference."""
    probe = [*texts, *SPM_STRESS_TEXTS]
    for text, ids in zip(probe, encoder.encode(probe)):
        want = list(tokenizer.tokenize(text)) + ([tokenizer.eod] if append_eod else [])
        if ids.tolist() != want:
            return f"batched ids differ from Megatron's on {text[:40]!r}"
    return None


def choose_spm_encoder(tokenizer: Any, texts: list[str], *, append_eod: bool,
                       workers: int) -> tuple[SpmEncoder | None, str]:
    """``(encoder, why)`` for a Megatron SentencePiece tokenizer, or ``(None, why not)``."""
    proc, what = spm_processor(tokenizer)
    if proc is None:
        return None, what
    enc = SpmEncoder(proc, eod=tokenizer.eod if append_eod else None, workers=workers,
                     chunkable=cut_safe(proc))
    diff = probe_spm(enc, tokenizer, texts, append_eod=append_eod)
    if diff is not None:
        return None, diff
    diff = probe_spm(enc, tokenizer, list(STRESS_TEXTS), append_eod=append_eod)
    if diff is not None:
        return None, diff
    cuts = "long lines cut at spaces" if enc.chunkable else "long lines encoded whole"
    return enc, (f"{what}; ids equal Megatron's on {len(texts)} documents "
                 f"and {len(SPM_STRESS_TEXTS) + len(STRESS_TEXTS)} stress texts; {cuts}")


class SpmTokenizer:
    """Megatron's SentencePiece tokenizer (the three types, Megatron-LM's defaults) computed
    with ``sentencepiece`` alone: no torch, Megatron-Core or transformers import (~6 CPU-s).

    ``tokenize``: ``encode_as_ids``; ``eod``: ``eos_id``; ``vocab_size``: the piece count; the
    id -> piece table for the identity. Used in place of Megatron's only where
    :mod:`~megatron_endprompt.data.tokenize.tokenizer_verdict` has found both equal for the same
    model file and library versions.
    """

    def __init__(self, model_file: str) -> None:
        import sentencepiece

        self.tokenizer = sentencepiece.SentencePieceProcessor(model_file=model_file)
        self.vocab_size = self.tokenizer.get_piece_size()
        self.eod = self.tokenizer.eos_id()  # Megatron's eod: eos_id, -1 when there is none

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode_as_ids(text)

    def ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.id_to_piece(int(i)) for i in ids]

    def detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode_ids([int(i) for i in ids])
