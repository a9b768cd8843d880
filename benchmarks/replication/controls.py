"""Data of the mini-replication's controls: rows that isolate the position jump.

* ``d0`` **no jump**: (d)'s own sidecar — the same samples, tokens and loss weights — with every
  record's terminal start set to ``T = a``, so positions are contiguous ``0..P-1`` (still under
  PI ``s`` at training). (d) - (d0) is then the effect of the jump alone.
* ``a1`` **PI + short fine-tuning**: ``P``-token windows of the fine-tuning documents' stream,
  contiguous positions (plain prefix, Megatron's own packing): the null for (e) and (g), which
  train on the same stream windows.
* ``g1p`` / ``g1n`` **the paper's configuration on data that can show it**: short documents
  whose fact->recall pairs lie inside one sample's first ``a`` tokens, closed by the EP1
  prompt terminal at ``L - b`` with a small ``w`` (``g1p``), or the same context without a
  terminal (``g1n``): the stream cut at (g1p)'s own points (``a = P - len(EP1)`` tokens,
  stride ``a``, the same document order and sample count), contiguous positions, so both get
  the same short-range supervision and differ only by the far anchor. Evaluated at long
  range: does a content-free far anchor extend a short-range skill to the full window?
* ``g1nP``: the earlier null, ``P``-token stream windows (Megatron's packing): it cut longer
  windows than (g1p)'s ``a`` and so held whole documents more often (the report's data table).
"""

from __future__ import annotations

import functools

import numpy as np
from megatron_endprompt.disk import atomic_path

from benchmarks.replication import data
from benchmarks.replication.protocol import ROWS

#: Methods whose training data is a plain prefix (contiguous positions, Megatron's packing).
PLAIN_STREAM = tuple(k for k, r in ROWS.items() if r.plain == "stream")


def make_contiguous(sidecar: str) -> int:
    """Rewrite ``sidecar`` (a no-PoSE layout) with ``T = a`` in every record; returns samples."""
    from megatron_endprompt.data.sidecar.sidecar import read_sidecar, write_sidecar

    sc = read_sidecar(sidecar)
    if sc.header.layout["pose_chunks"] != 1:
        raise ValueError(f"{sidecar}: d0 needs a layout without PoSE pieces")
    records = np.array(sc.records, dtype=np.int32)
    records[:, 1] = records[:, 0]  # terminal start = context length: positions 0..P-1
    sources = None if sc.sources is None else np.array(sc.sources, dtype=np.int64)
    header = sc.header
    with atomic_path(sidecar, fsync=False) as tmp:
        write_sidecar(tmp, header, records, sources)
    return len(records)


def prompt_context_length(c: dict, spm: str, prompt: str = "ep1") -> int:
    """(g1p)'s ``a = P - len(prompt)``: its prompt tokenized as preprocessing tokenizes it."""
    return c["P"] - _prompt_tokens(spm, prompt)


@functools.lru_cache(maxsize=None)
def _prompt_tokens(spm: str, prompt: str) -> int:
    """Tokens of a built-in prompt under ``spm`` (built once per model: every (g1n) run and
    the data table ask)."""
    from megatron_endprompt.data.prepare.prompts import PROMPT_SETS, tokenize_prompt
    from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer

    tok = build_tokenizer(TokenizerSpec(tokenizer_type="GPTSentencePieceTokenizer",
                                        tokenizer_model=spm))
    (text,) = PROMPT_SETS[prompt]
    return len(tokenize_prompt(text, tok))


def short_doc_tokens(c: dict) -> tuple[int, int]:
    """``(min, max)`` tokens of a g1 document: short enough that a whole document (fact and
    recall) usually fits the ``a = P - len(EP1)`` context of one sample (EP1 is < 24 tokens)."""
    hi = c["P"] - 24
    return max(24, hi // 2), hi


def write_short_docs(path: str, c: dict, count, num_docs: int) -> str:
    """The g1 documents: the fact in the first ``min/2`` tokens, the recall at the end."""
    lo, hi = short_doc_tokens(c)
    return data.write_docs(path, num_docs=num_docs, min_tokens=lo, max_tokens=hi, seed=14,
                           count=count, fact_span=max(8, lo // 2))


def layout_flags(method: str, *, terminal: int, w: float, prompt_w: float) -> list[str] | None:
    """Preprocessing flags of a control row; ``None`` for the plain-stream ones."""
    r = ROWS[method]
    if r.plain:
        return None
    return r.flags(terminal=terminal, weight=w, prompt_weight=prompt_w)
