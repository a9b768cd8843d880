"""Perplexity per document, the PoSE / LongLoRA protocol (the sliding-window evaluation of the
HF "Perplexity of fixed-length models" guide).

Each document is tokenized on its own, starting as the tokenizer starts a text (its BOS when it
adds one: Llama; nothing for a tokenizer that adds none, e.g. SmolLM2, whose ``bos_token``
``<|im_start|>`` opens a chat turn, not a document). At
evaluation length ``L`` windows of at most ``L`` tokens start every ``stride`` tokens; a window
scores only the tokens after the previous window's end (its new tokens), with everything before
them in the window as context, so every token of the document is scored exactly once and BOS
never. PPL@L = ``exp(sum NLL / scored tokens)`` over the documents with at least ``L`` tokens
(shorter ones would not test length ``L``; they are counted as skipped).

Input: PG19-style JSONL (one document per line, text in field ``text``) or one ``.txt``
document. Logits are computed from the final hidden states in chunks of positions, only over
the scored positions, so a 128K-token window never materialises ``L x vocab`` float32 logits.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation.core.scoring import PerplexityStats

__all__ = ["load_documents", "tokenize_documents", "doc_windows", "window_tail_nll",
           "run_doc_perplexity", "count_windows", "run_stream_perplexity"]


def load_documents(path: str, *, key: str = "text", flag: str = "--ppl-data") -> list[str]:
    """Documents of a ``.jsonl`` file (field ``key`` per line) or a ``.txt`` file (one)."""
    if not os.path.isfile(path):
        raise UserError(f"{flag} {path}: no such file; give a .jsonl (PG19-style) or .txt file")
    if not path.endswith((".jsonl", ".txt")):
        raise UserError(f"{flag} {path}: unknown format; give a .jsonl or .txt file")
    docs: list[str] = []
    try:
        with open(path, encoding="utf-8") as f:
            if path.endswith(".txt"):
                docs.append(f.read())
            else:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        doc = json.loads(line)[key]
                    except (json.JSONDecodeError, KeyError, TypeError):
                        raise UserError(f"{flag} {path}:{n}: not a JSON object with a string "
                                        f"field {key!r} (set --ppl-key)") from None
                    if not isinstance(doc, str):
                        raise UserError(f"{flag} {path}:{n}: field {key!r} is not a string")
                    if not doc.isascii():  # lone surrogates from \ud800-style escapes
                        try:
                            doc.encode("utf-8")
                        except UnicodeEncodeError as exc:
                            raise UserError(
                                f"{flag} {path}:{n}: lone surrogate "
                                f"{doc[exc.start].encode('unicode_escape').decode()} in field "
                                f"{key!r} (half of a UTF-16 pair); fix or drop the line") from None
                    docs.append(doc)
    except UnicodeDecodeError as exc:
        raise UserError(f"{flag} {path}: not UTF-8 text ({exc.reason})") from None
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise UserError(f"{flag} {path}: no text to score")
    return docs


def document_start(tokenizer: Any) -> list[int]:
    """The ids the tokenizer puts before a text with its special tokens on (``[BOS]`` for
    Llama, ``[]`` for one that adds none, even when it names a ``bos_token``)."""
    probe = "a"
    full = list(tokenizer(probe, add_special_tokens=True, verbose=False)["input_ids"])
    plain = list(tokenizer(probe, add_special_tokens=False, verbose=False)["input_ids"])
    for i in range(len(full) - len(plain) + 1):
        if full[i:i + len(plain)] == plain:
            return full[:i]
    return []


def tokenize_documents(tokenizer: Any, docs: Sequence[str], *,
                       max_tokens: int | None = None) -> list[np.ndarray]:
    """Token ids per document, after :func:`document_start` (the tokenizer's BOS when it adds
    one); cut to ``max_tokens``."""
    start = document_start(tokenizer)
    out = []
    for b in range(0, len(docs), 64):
        enc = tokenizer(list(docs[b:b + 64]), add_special_tokens=False,
                        verbose=False)["input_ids"]
        for ids in enc:
            arr = np.asarray(start + list(ids), dtype=np.int64)
            out.append(arr[:max_tokens] if max_tokens else arr)
    return out


def doc_windows(n_tokens: int, length: int, stride: int) -> list[tuple[int, int, int]]:
    """``(begin, end, new)`` per window of a document of ``n_tokens`` tokens: the window is
    ``ids[begin:end]`` and scores its last ``new`` next-token predictions. A window never
    starts after the previous window's last token (with ``stride >= length`` it starts there),
    so its first new token has context in the window and every token is scored once."""
    if stride < 1 or length < 2:
        raise ValueError("stride >= 1 and length >= 2")
    out, prev_end, begin = [], 1, 0  # token 0 (BOS, or the first token) is never a target
    while prev_end < n_tokens:
        begin = min(begin, prev_end - 1)
        end = min(begin + length, n_tokens)
        if end > prev_end:
            out.append((begin, end, end - prev_end))
            prev_end = end
        begin += stride
    return out


def _needs_full_logits(model: Any) -> bool:
    cfg = model.config
    return bool(getattr(cfg, "final_logit_softcapping", None)
                or getattr(cfg, "logit_scale", None)
                or model.get_output_embeddings() is None)


def window_tail_nll(model: Any, ids: Any, new: int, *, chunk: int = 1024) -> float:
    """Summed NLL (float64) of the last ``new`` next-token predictions of ``ids`` (shape
    ``(1, T)`` on the model's device): targets ``ids[0, T-new:]`` from positions
    ``T-new-1 .. T-2``."""
    import torch
    import torch.nn.functional as F

    t = ids.shape[1]
    if not 0 < new < t:
        raise ValueError(f"a window of {t} tokens can score 1..{t - 1} targets, not {new}")
    targets = ids[:, t - new:]
    with torch.inference_mode():
        if _needs_full_logits(model):
            logits = model(input_ids=ids, use_cache=False).logits[:, t - new - 1:t - 1]
            return float(F.cross_entropy(logits.float().transpose(1, 2), targets,
                                         reduction="sum").double())
        hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
        hidden = hidden[:, t - new - 1:t - 1]
        head = model.get_output_embeddings()
        total = 0.0
        for s in range(0, new, chunk):
            total += float(F.cross_entropy(head(hidden[:, s:s + chunk]).float().transpose(1, 2),
                                           targets[:, s:s + chunk], reduction="sum").double())
        return total


def _spread(items: list[Any], cap: int | None) -> list[Any]:
    """At most ``cap`` of ``items``, evenly spread (all when ``cap`` is falsy)."""
    if not cap or len(items) <= cap:
        return items
    pick = np.linspace(0, len(items) - 1, cap).round().astype(int)
    return [items[i] for i in pick]


def run_doc_perplexity(model: Any, docs: Sequence[np.ndarray], *, length: int, stride: int,
                       max_windows: int | None = None, progress: Any = None) -> dict[str, Any]:
    """PPL@``length`` of the documents (see the module docstring): ``{"ppl", "nll", "tokens",
    "windows", "docs", "docs_skipped"}`` (``ppl`` ``None`` when it overflows).
    ``max_windows`` caps the windows (evenly spread over all documents' windows)."""
    import torch

    device = next(model.parameters()).device
    stats = PerplexityStats()
    used = [d for d in docs if len(d) >= length]
    jobs = [(d, w) for d in used for w in doc_windows(len(d), length, stride)]
    for doc, (begin, end, new) in _spread(jobs, max_windows):
        ids = torch.from_numpy(doc[begin:end]).unsqueeze(0).to(device)
        stats.add(nll_sum=window_tail_nll(model, ids, new), tokens=new)
        if progress is not None:
            progress.update(1)
    out: dict[str, Any] = {"docs": len(used), "docs_skipped": len(docs) - len(used)}
    if stats.tokens:
        out.update(stats.as_dict())
    else:
        out.update({"ppl": None, "nll": None, "tokens": 0, "windows": 0})
    return out


def count_windows(docs: Sequence[np.ndarray], *, length: int, stride: int,
                  max_windows: int | None = None) -> int:
    """Windows ``run_doc_perplexity`` will run (for a progress bar)."""
    n = sum(len(doc_windows(len(d), length, stride)) for d in docs if len(d) >= length)
    return min(n, max_windows) if max_windows else n


def run_stream_perplexity(model: Any, tokenizer: Any, docs: Sequence[str], *, length: int,
                          stride: int, max_windows: int | None = None,
                          progress: Any = None) -> dict[str, Any]:
    """The pre-PoSE protocol, kept for old results (``--ppl-protocol legacy-stream``): the
    documents joined by EOS without BOS into one stream; windows of ``length`` inputs every
    ``stride`` tokens, every token of every window scored."""
    import torch

    eos = tokenizer.eos_token_id
    parts: list[int] = []
    for ids in tokenizer(list(docs), add_special_tokens=False, verbose=False)["input_ids"]:
        if parts and eos is not None:
            parts.append(eos)
        parts.extend(ids)
    tokens = np.asarray(parts, dtype=np.int64)
    starts = _spread(list(range(0, len(tokens) - length, stride)), max_windows)
    device = next(model.parameters()).device
    stats = PerplexityStats()
    for s in starts:
        ids = torch.from_numpy(tokens[s:s + length + 1]).unsqueeze(0).to(device)
        stats.add(nll_sum=window_tail_nll(model, ids, length), tokens=length)
        if progress is not None:
            progress.update(1)
    if not stats.tokens:
        return {"ppl": None, "nll": None, "tokens": 0, "windows": 0}
    return stats.as_dict()
