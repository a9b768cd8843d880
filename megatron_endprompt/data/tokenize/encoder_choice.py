"""Which encoder preprocessing uses: the chooser above the three fast paths.

Why a module of its own: the choice spans the HF fast path (:mod:`.encode`), tiktoken
(:mod:`.tiktoken_encoder`) and SentencePiece batches (:mod:`.spm_encoder`); living inside one of
them made that encoder import its sibling and its sibling import it back. Here it imports all
three and none of them imports it.
"""

from __future__ import annotations

from megatron_endprompt.data.tokenize import encode
from megatron_endprompt.data.tokenize.json_tokenizer import JsonTokenizer
from megatron_endprompt.data.tokenize.spm_encoder import choose_spm_encoder
from megatron_endprompt.data.tokenize.tiktoken_encoder import (STRESS_TEXTS, probe_tiktoken,
                                                               tiktoken_encoder)

__all__ = ["BACKENDS", "choose_encoder"]

BACKENDS = ("auto", "hf", "tiktoken")
"""``--tokenizer-backend``: ``auto`` (tiktoken when it converts and passes the probe, else HF
``tokenizers``, else Megatron's tokenizer per document), ``hf`` (never tiktoken), ``tiktoken``
(refuse the run when tiktoken cannot be used)."""


def choose_encoder(tokenizer, texts: list[str], *, append_eod: bool, workers: int,
                   backend: str = "auto"):
    """``(encoder or None, path, why)``: the encoder preprocessing uses for Megatron's
    ``tokenizer``, checked on ``texts`` (the first documents). ``path`` is ``tiktoken``,
    ``rust-batch`` (HF ``tokenizers``), ``spm-batch`` (SentencePiece batches,
    :mod:`.spm_encoder`) or ``per-document`` (Megatron's tokenizer in a pool)."""
    if encode.fast_backend(tokenizer) is None:
        spm, why = choose_spm_encoder(tokenizer, texts, append_eod=append_eod, workers=workers)
        if spm is not None:
            return spm, "spm-batch", why
        return None, "per-document", ("not a Hugging Face fast tokenizer" if why ==
                                      "not a SentencePiece tokenizer" else
                                      f"SentencePiece batches not used: {why}")
    hf = encode.probe_fast_encoder(tokenizer, texts, append_eod=append_eod)
    if hf is None:
        return None, "per-document", "the HF fast path disagreed with Megatron's ids"
    if backend == "hf":
        return hf, "rust-batch", "--tokenizer-backend hf"
    fast, what = tiktoken_encoder(hf.backend, eod=hf.eod, workers=workers)
    if fast is not None:
        diff = probe_tiktoken(fast, tokenizer, texts, append_eod=append_eod)
        fast.slow_docs = 0  # the summary counts the corpus' documents, not the probe's
        if diff is None:
            whose = ("tokenizers'" if isinstance(tokenizer, JsonTokenizer) else "Megatron's")
            return fast, "tiktoken", (f"{what}; ids equal {whose} on {len(texts)} documents "
                                      f"and {len(STRESS_TEXTS) + 1} stress texts")
        fast.close()
        what = diff
    return hf, "rust-batch", f"tiktoken not used: {what}"
