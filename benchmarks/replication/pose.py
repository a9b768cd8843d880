"""Row (e) of the mini-replication: PoSE as PoSE's own training code draws its samples.

Read (not copied) from ``dwzhu-pku/PoSE``, ``src/train_pose.py`` at commit
``a3d4ba8bd38e6615ba778d9a1061e380c8e69647``, function ``train_preprocess_function_pose``
(the ``--method pose`` path). Per document, tokenized and truncated to ``5 x P`` tokens (``P``:
the model's training window, ``model_max_position_embeddings``; ``L``: the scaled window):

* ``len_chunk = min(n, P)``;
* **chunk law**: the first chunk is tokens ``[0, r1)`` with ``r1 ~ U{1 .. ceil(len_chunk / 2)}``
  (``random.randint(1, (len_chunk + 1) // 2)``); the second chunk is the ``len_chunk - r1``
  tokens ending at ``r2 ~ U{len_chunk .. n}``, i.e. tokens ``[l2, r2)``,
  ``l2 = r2 - (len_chunk - r1)``;
* **text skip at the cut**: ``l2 - r1 = r2 - len_chunk ~ U{0 .. n - len_chunk}`` tokens of the
  document between the chunks are not used (the second chunk is the text *after* a gap);
* **skip law** (positions): the first chunk at ``0 .. r1 - 1``, the second at ``r1 + k ..`` with
  ``k ~ U{0 .. L - len_chunk}`` (the code fixes the first chunk's offset ``lt = 0`` "to make the
  coverage of large relative positions more uniform" and draws ``rt`` in
  ``[0, L - len_chunk]``), so every position is ``<= L - 1``;
* **loss**: ``labels = input_ids``: every next-token prediction, uniform weight, the first token
  of the second chunk predicted from the last of the first (across both skips).

Ours (:func:`pose_draw`, :func:`pose_samples`) draws exactly that law per document with
``numpy`` (``layout.sample_rng(seed, document)``), with three stated differences forced by the
project's fixed ``P + 1``-token samples: ``n`` counts the document's text tokens (its EOD
excluded) and a sample also carries the *label* after its last input -- token ``r2`` of the
document, the EOD at its end -- so a sample has ``P`` predictions where PoSE's HF trainer has
``P - 1`` (its last input's logit is unused); documents with ``n < P`` (PoSE: shorter samples)
are dropped and counted. The samples are stored as a spans sidecar over the preprocessed
documents (:func:`write_pose_sidecar`), in the project's two-piece record: ``pose_chunks = 2``
and a one-token "terminal" (the last input) that continues the second chunk, record
``[a = P - 1, T = P - 1 + k, r1, r1 + k]`` -- uniform loss weight 1. The project's own
two-piece layout (cut uniform in the context, sorted-uniform skip, anchored document tail, no
text skip) stays as row (f) ET(PoSE).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from megatron_endprompt.data.sidecar.indexed_io import IndexReader
from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path, write_sidecar
from megatron_endprompt.data.sidecar.spans import pack_sources, token_stream_bounds
from megatron_endprompt.layout import sample_rng
from megatron_endprompt.disk import atomic_path

#: The source read, as cited in the module docstring (stored with results).
LAW = "dwzhu-pku/PoSE src/train_pose.py@a3d4ba8bd38e6615ba778d9a1061e380c8e69647"

#: PoSE truncates each document to this many training windows (``max_length = 5 x P``).
TRUNCATE_WINDOWS = 5

#: Preprocessing flags of row (e): a valid two-piece spans sidecar, rewritten by
#: :func:`write_pose_sidecar` (b = 1, uniform weight: PoSE has no anchored terminal).
PREPROCESS_FLAGS = ["--placement", "random", "--pose-chunks", "2", "--terminal-source",
                    "document-tail", "--terminal-length", "1", "--terminal-loss-weight", "1",
                    "--context-loss-weight", "1"]


@dataclass(frozen=True, kw_only=True)
class PoseDraw:
    """One document's PoSE sample, in document token offsets."""

    r1: int
    """First chunk: tokens ``[0, r1)`` at positions ``0 .. r1 - 1``."""
    l2: int
    """Second chunk's first token (``l2 - r1`` tokens of text skipped)."""
    r2: int
    """Second chunk's end (exclusive); token ``r2`` is the sample's final label."""
    k: int
    """Position skip: the second chunk starts at position ``r1 + k``."""


def pose_draw(rng: np.random.Generator, n_text: int, P: int, L: int) -> PoseDraw:
    """PoSE's law for a document of ``n_text >= P`` text tokens (module docstring)."""
    n = min(n_text, TRUNCATE_WINDOWS * P)
    chunk = min(n, P)
    r1 = int(rng.integers(1, (chunk + 1) // 2, endpoint=True))
    r2 = int(rng.integers(chunk, n, endpoint=True))
    k = int(rng.integers(0, L - chunk, endpoint=True))
    return PoseDraw(r1=r1, l2=r2 - (chunk - r1), r2=r2, k=k)


def pose_samples(starts: np.ndarray, ends: np.ndarray, *, P: int, L: int,
                 seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Records ``[m, 4]`` int32, piece pointers ``[m + 1]`` and pieces ``[2m, 2]`` (stream
    offset, length) of one PoSE sample per document ``[start, end)`` of the token stream (each
    ending with its EOD), plus the number of documents dropped (``n_text < P``)."""
    records, pieces, dropped = [], [], 0
    for j, (start, end) in enumerate(zip(np.asarray(starts).tolist(),
                                         np.asarray(ends).tolist())):
        n_text = end - start - 1
        if n_text < P:
            dropped += 1
            continue
        d = pose_draw(sample_rng(seed, j), n_text, P, L)
        records.append([P - 1, P - 1 + d.k, d.r1, d.r1 + d.k])
        # P + 1 tokens: the first chunk, then the second chunk and its label (token r2)
        pieces += [[start, d.r1], [start + d.l2, d.r2 + 1 - d.l2]]
    m = len(records)
    return (np.array(records, dtype=np.int32).reshape(m, 4), np.arange(0, 2 * m + 1, 2),
            np.array(pieces, dtype=np.int64).reshape(2 * m, 2), dropped)


def write_pose_sidecar(prefix: str, *, seed: int) -> dict:
    """Replace the sidecar of ``prefix`` (preprocessed with :data:`PREPROCESS_FLAGS`) by PoSE's
    samples of the same documents; returns its PoSE counters."""
    path = sidecar_path(prefix)
    old = read_sidecar(path, prefix=prefix)
    layout = old.layout
    if (layout.pose_chunks, old.header.terminal_length) != (2, 1):
        raise ValueError(f"{path}: PoSE needs a sidecar made with {PREPROCESS_FLAGS}")
    P, L = layout.seq_length, layout.target_length
    index = IndexReader(prefix + ".idx")
    starts, ends = token_stream_bounds(index, prefix, os.path.getsize(prefix + ".bin"))
    records, ptr, pieces, dropped = pose_samples(starts, ends, P=P, L=L, seed=seed)
    if not len(records):
        raise ValueError(f"{prefix}: no document has the P = {P} text tokens PoSE needs")
    packed, kind = pack_sources(ptr, pieces, P)
    header = old.header
    header.num_samples, header.seed = len(records), seed
    header.sources = {**header.sources, "layout": kind}
    pose = {"law": LAW,
            "samples": len(records), "documents_dropped_shorter_than_P": dropped,
            "text_skip_mean": float(np.mean(pieces[1::2, 0] - pieces[0::2, 0]
                                            - pieces[0::2, 1])),
            "position_skip_mean": float(np.mean(records[:, 1] - records[:, 0]))}
    header.stats = {**header.stats, "samples_written": len(records),
                    "tokens_in_samples": len(records) * (P + 1), "pose": pose}
    with atomic_path(path, fsync=False) as tmp:
        write_sidecar(tmp, header, records, packed)
    return pose
