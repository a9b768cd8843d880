"""Row (e) of the mini-replication: PoSE as PoSE's own training code draws its samples.

The law lives in the package, :mod:`megatron_endprompt.pose_law` (read from
``dwzhu-pku/PoSE`` ``src/train_pose.py``, cited there): per document of ``n`` text tokens
(truncated to ``5 x P``), a first chunk of ``r1 ~ U{1 .. ceil(P/2)}`` tokens, a text skip
``U{0 .. n - P}`` at the cut, a position skip ``k ~ U{0 .. L - P}``, uniform loss. Preprocessing
draws it itself with ``--placement pose`` (:data:`POSE_FLAGS`; ET(PoSE) with PoSE's law:
:data:`ET_POSE_FLAGS`).

Kept here for the rows already built the older way: :func:`write_pose_sidecar` rewrites a
sidecar made with :data:`PREPROCESS_FLAGS` (the project's two-piece ``random`` layout, ``b = 1``)
into PoSE's samples of the same documents, drawn by the package's law with the same
per-document generators ``layout.sample_rng(seed, document)`` -- the very samples
``--placement pose --terminal-length 1`` writes -- stored in the ``random`` two-piece record
``[a = P - 1, T = P - 1 + k, r1, r1 + k]`` (uniform loss weight 1). Documents with ``n < P``
(PoSE: shorter samples) are dropped and counted.
"""

from __future__ import annotations

import os

import numpy as np

from megatron_endprompt import pose_law
from megatron_endprompt.data.sidecar.indexed_io import IndexReader
from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path, write_sidecar
from megatron_endprompt.data.sidecar.spans import pack_sources, token_stream_bounds
from megatron_endprompt.layout import sample_rng
from megatron_endprompt.disk import atomic_path

#: The source read (stored with results).
LAW = pose_law.LAW

#: PoSE truncates each document to this many training windows (``max_length = 5 x P``).
TRUNCATE_WINDOWS = pose_law.TRUNCATE_WINDOWS

#: Preprocessing (or ``build_endprompt_sidecar.py``) flags of row (e): PoSE itself, its last
#: input a one-token "terminal" continuing the second chunk, uniform loss weight 1.
POSE_FLAGS = ["--placement", "pose", "--terminal-source", "continuation", "--terminal-length",
              "1", "--terminal-loss-weight", "1", "--context-loss-weight", "1"]

#: ET(PoSE) with PoSE's law: PoSE's two chunks as the context, then EP1 at ``L - b`` (w = 0.1).
ET_POSE_FLAGS = ["--placement", "pose", "--terminal-source", "prompt", "--terminal-prompts",
                 "ep1", "--terminal-loss-weight", "0.1"]

#: Preprocessing flags of row (e): a valid two-piece spans sidecar, rewritten by
#: :func:`write_pose_sidecar` (b = 1, uniform weight: PoSE has no anchored terminal).
PREPROCESS_FLAGS = ["--placement", "random", "--pose-chunks", "2", "--terminal-source",
                    "document-tail", "--terminal-length", "1", "--terminal-loss-weight", "1",
                    "--context-loss-weight", "1"]


PoseDraw = pose_law.PoseDraw


def pose_draw(rng: np.random.Generator, n_text: int, P: int, L: int) -> PoseDraw:
    """PoSE's law for a document of ``n_text >= P`` text tokens (:func:`pose_law.draw` with
    the window ``P``)."""
    return pose_law.draw(rng, text_tokens=n_text, window=P, seq_length=P, target_length=L)


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
