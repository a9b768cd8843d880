"""The training data of each mini-replication method, and the check that it has that method's
layout (every run checks its own data before training; ``--smoke`` checks every method's).

:func:`build` writes a method's data through the product's preprocessing (plus the benchmark's
sidecar rewrites for (d0) and (e)) and returns the ``train_argv`` keywords that train on it;
:func:`check` reads it back -- the sidecar verified as the trainer does, every record one that
``make_record`` can draw, every position below ``L`` -- and refuses, as one ``error:`` line, data
that is not the method's layout: (c)/(g)/(g1p) terminals at ``L - b``, (d)/(f) terminals drawn
in ``[a, L - b]``, (d0) and (g1n) with no jump ((g1n) cut to (g1p)'s ``a < P``), (e) PoSE's first chunk ``<= ceil(P/2)`` and its text skip,
(f) PoSE pieces inside an EndPrompt sample, prompt sets and loss weights, and the plain data
of (b)/(h) (one ``L``-token document per sequence), (hd)/(hg) (a stream of unpadded documents
in ``L``-token windows) and (a1)/(g1nP) (no sidecar).
"""

from __future__ import annotations

import os

import numpy as np

from benchmarks.replication import controls
from benchmarks.replication import run

#: Methods trained on plain Megatron data (contiguous positions, no sidecar).
PLAIN = ("b", "h", "hd", "hg", *controls.PLAIN_STREAM)
#: Equal-token full-length rows: a document stream packed into ``L``-token windows (no padding).
PACKED = {"hd": "ft_stream", "hg": "g1_plain"}


def build(rep, m: str, tag: str, seed: int, *, terminal: int, w: float) -> dict:
    """Write method ``m``'s training data for fine-tuning seed ``seed``; returns the
    ``train_argv`` keywords (``seq``, ``target``, ``mb``, ``data_prefix``, ...)."""
    c = rep.c
    if m in ("b", "h"):
        return dict(seq=rep.L, target=2 * rep.L, mb=1, data_prefix=rep.w("ft_plain"),
                    replay=True, eod_mask=True)  # the EOD padding is not trained
    if m in PACKED:  # the stream packed in L-token windows, no padding: every token trained
        return dict(seq=rep.L, target=2 * rep.L, mb=1, data_prefix=rep.w(PACKED[m]),
                    replay=True)
    if m in controls.PLAIN_STREAM:  # contiguous P-token windows of a document stream
        return dict(seq=rep.P, target=rep.L, mb=max(1, c["ft_docs"] // 2), replay=True,
                    data_prefix=rep.w("ft_stream" if m == "a1" else "g1_plain"))
    from megatron_endprompt.cli import preprocess
    from megatron_endprompt.data.sidecar.sidecar import sidecar_path

    prefix = rep.w(f"ft_{tag}")
    lay = dict(terminal=terminal, w=w, prompt_w=c["prompt_w"])
    ctl = m in ("d0", "g1p", "g1n")
    flags = controls.layout_flags(m, **lay) if ctl else run.layout_flags(m, **lay)
    # (g1n): (g1p)'s context length a as the whole sample: (g1p)'s cut points, no terminal
    seq = controls.prompt_context_length(c, rep.spm) if m == "g1n" else rep.P
    run.tool(preprocess.main, [
        "--input", rep.w("g1.jsonl" if m in ("g1p", "g1n") else "ft.jsonl"),
        "--output-prefix", prefix,
        "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", rep.spm,
        "--seq-length", str(seq), "--target-length", str(rep.L), "--append-eod",
        "--workers", "1", "--no-progress", "--seed", str(1000 + seed), *flags])
    if m in ("d0", "g1n"):  # positions made contiguous ((d0): (d)'s own samples, same seed)
        controls.make_contiguous(sidecar_path(prefix))
    return dict(seq=seq, target=rep.L, mb=max(1, c["ft_docs"] // 2), data_prefix=prefix)


def check(m: str, kw: dict, c: dict, *, terminal: int, w: float) -> str:
    """Refuse data that is not method ``m``'s layout (one ``error:`` line); returns a summary."""
    from megatron_endprompt.data.sidecar.indexed_io import IndexReader
    from megatron_endprompt.data.sidecar.prompts import PROMPT_SETS
    from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
    from megatron_endprompt.data.sidecar.sidecar_checks import check_records
    from megatron_endprompt.layout import positions_from_record

    prefix, L, P = kw["data_prefix"], c["L"], c["P"]

    def need(ok, why: str) -> None:
        if not ok:
            raise SystemExit(f"error: method ({m}): {prefix}: {why}; its layout is broken "
                             "(benchmarks/replication/layouts.py)")
    if m in PLAIN:
        need(not os.path.exists(sidecar_path(prefix)), "plain data has a sidecar")
        lengths = np.asarray(IndexReader(prefix + ".idx").sequence_lengths)
        need(len(lengths) > 0, "no document")
        if m in ("b", "h"):
            need(np.all(lengths == L), f"full-length documents are not padded to L = {L}")
        if m in PACKED:  # documents with their one EOD each, unpadded: every token is text
            idx = IndexReader(prefix + ".idx")
            tokens = np.memmap(prefix + ".bin", dtype=idx.dtype, mode="r")  # only 2 per doc read
            ends = np.cumsum(lengths)
            eod = tokens[ends - 1]
            need(np.all(eod == eod[0]), "a document does not end with the EOD token")
            need(not np.any(tokens[ends - 2] == eod[0]), "EOD padding in a packed stream")
            need(kw.get("seq") == L, f"packed into {kw.get('seq')}-token windows, not L = {L}")
        return f"({m}) plain: {len(lengths)} sequences"
    sc = read_sidecar(sidecar_path(prefix), prefix=prefix)  # verified as the trainer does
    h, lay = sc.header, sc.layout
    rec = np.asarray(sc.records, dtype=np.int64)
    seq = kw.get("seq", P)  # (g1n): (g1p)'s a; every other sidecar row: P
    need((lay.seq_length, lay.target_length) == (seq, L), f"P, L = {lay.seq_length}, "
         f"{lay.target_length}, not {seq}, {L}")
    bad = check_records(rec.astype(np.int32), lay, h.terminal_length,
                        contiguous_ok=h.terminal_source == "document-tail")
    need(bad is None, f"impossible record {bad}")
    top = max(int(positions_from_record(r, seq).max()) for r in rec)
    need(top <= L - 1, f"a position {top} >= L")
    a, T = rec[:, 0], rec[:, 1]
    jumped = T > a
    prompt = h.terminal_source == "prompt"
    want = {"c": ("document-tail", "fixed", 1), "d": ("document-tail", "random", 1),
            "d0": ("document-tail", "random", 1), "e": ("continuation", "pose", 2),
            "etp": ("prompt", "pose", 2),
            "f": ("document-tail", "random", 2), "g": ("prompt", "fixed", 1),
            "g1p": ("prompt", "fixed", 1), "g1n": ("continuation", "random", 1)}[m]
    need((h.terminal_source, lay.placement, lay.pose_chunks) == want,
         f"source/placement/pieces {h.terminal_source}/{lay.placement}/{lay.pose_chunks}, "
         f"not {'/'.join(map(str, want))}")
    weight = c["prompt_w"] if prompt else (1.0 if m in ("e", "g1n") else w)
    need(lay.loss_weights.terminal == weight and lay.loss_weights.context == 1.0,
         f"loss weights {lay.loss_weights.terminal}/{lay.loss_weights.context}, not {weight}/1")
    if prompt:
        names = PROMPT_SETS["ep1" if m in ("g1p", "etp") else "ep1-3"]
        need(tuple(h.prompts) == tuple(names), f"prompts {h.prompts}, not {list(names)}")
    else:
        need(h.terminal_length == (1 if m in ("e", "g1n") else terminal),
             f"terminal length {h.terminal_length}")
    if m in ("c", "g", "g1p", "etp"):
        need(jumped.any() and np.all(T[jumped] == L - (P - a[jumped])),
             "terminals not at L - b")
    if m in ("d", "f"):
        need(jumped.any() and np.any(T[jumped] < L - (P - a[jumped])), "no random terminal")
    if m in ("d0", "g1n"):
        need(not jumped.any(), "a position jump")
    if m == "g1n":
        need(seq < P, f"(g1p)'s context length a = {seq} is not below P = {P}")
    if m in ("e", "etp"):  # PoSE's law over the context: a first chunk of U{1..ceil(a/2)}
        need(np.all((rec[:, 2] >= 1) & (rec[:, 2] <= (a + 1 + (m == "e")) // 2)),
             "a first chunk outside 1..ceil(a/2)")
        stats = h.stats.get("pose", {})
        need(stats.get("samples") == len(rec) and stats.get("text_skip_mean", 0) > 0,
             "no text skip at the cut")
    return (f"({m}) {h.terminal_source}/{lay.placement}/N={lay.pose_chunks}: {len(rec)} "
            f"samples, {int(jumped.sum())} jumped, max position {top}")
