"""What each row's training data holds, for the report's data table: documents per step and the
share of documents that lie whole inside one training sample.

A short document whose fact and recall share a sample gives short-range supervision; a row
whose windows hold whole documents more often gets more of it. (g1p) cuts its stream every
``a = P - len(EP1)`` tokens, and the earlier null (g1nP) every ``P`` tokens, so the null held
whole documents more often; (g1n) now cuts at (g1p)'s points. The equal-token full-length rows
(hd)/(hg) pack the stream into ``L``-token windows.

Stream rows are counted on the document stream in file order (documents with their EOD, as
preprocessing and Megatron pack them). Megatron shuffles the document order of plain data
(hd, hg, a1, g1nP) before packing; the share of whole documents depends only on the lengths
and the window, so it is the same in expectation. Document-tail rows (c, d, d0, f) keep every
document's first ``a`` and last ``b`` tokens in one sample by construction: the whole-document
share is not the measure there (``None``).
"""

from __future__ import annotations

import numpy as np

from benchmarks.replication import controls
from benchmarks.replication.protocol import ROWS

#: Rows cut from a document stream: (stream prefix, window kind).
STREAM_ROWS = {"hd": ("ft_stream", "L"), "hg": ("g1_plain", "L"), "a1": ("ft_stream", "P"),
               "g1nP": ("g1_plain", "P"), "g1p": ("g1_plain", "a"), "g1n": ("g1_plain", "a")}
#: Rows with one document (its first ``a`` and last ``b`` tokens) per sample.
DOCUMENT_ROWS = ("b", "c", "d", "d0", "e", "f", "etp", "h")


def whole_share(lengths: np.ndarray, window: int) -> float:
    """Share of documents (``lengths``: tokens each, EOD included, in stream order) whose
    tokens lie inside one ``window``-token input window of a stride-``window`` cut."""
    ends = np.cumsum(lengths)
    starts = ends - lengths
    return float(np.mean(starts // window == (ends - 1) // window))


def row_stats(m: str, c: dict, lengths: dict[str, np.ndarray], a: int) -> dict:
    """``{"docs_per_step", "whole_doc_share"}`` of row ``m``; ``lengths``: token lengths of
    the streams by prefix name; ``a``: (g1p)'s context length."""
    P, L, per_step = c["P"], c["L"], c["ft_docs"]
    if m in STREAM_ROWS:
        prefix, kind = STREAM_ROWS[m]
        window = {"L": L, "P": P, "a": a}[kind]
        lens = lengths[prefix]
        sequences = ROWS[m].sequences_per_step(per_step, P=P, L=L)
        return {"docs_per_step": round(sequences * window / float(lens.mean()), 2),
                "whole_doc_share": round(whole_share(lens, window), 4),
                "window": window}
    if m in DOCUMENT_ROWS:
        sequences = ROWS[m].sequences_per_step(per_step, P=P, L=L)
        return {"docs_per_step": float(sequences), "whole_doc_share": None, "window": P}
    return {}


def collect(rep, methods: list[str]) -> dict[str, dict]:
    """The data table's statistics for ``methods`` from the work directory's streams."""
    from megatron_endprompt.data.sidecar.indexed_io import IndexReader

    lengths = {}
    for prefix in {STREAM_ROWS[m][0] for m in methods if m in STREAM_ROWS}:
        lengths[prefix] = np.asarray(IndexReader(rep.path(prefix) + ".idx").sequence_lengths,
                                     dtype=np.int64)
    needs_a = any(m in STREAM_ROWS and STREAM_ROWS[m][1] == "a" for m in methods)
    a = controls.prompt_context_length(rep.c, rep.spm) if needs_a else rep.P
    return {m: st for m in methods if (st := row_stats(m, rep.c, lengths, a))}
