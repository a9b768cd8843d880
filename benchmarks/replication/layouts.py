"""The training data of each mini-replication method, and the check that it has that method's
layout (every run checks its own data before training; ``--smoke`` checks every method's).

:func:`build` writes a method's data through the product's preprocessing (plus the benchmark's
sidecar rewrites for (d0) and (e)) and returns the ``train_argv`` keywords that train on it;
:func:`check` reads it back -- the sidecar verified as the trainer does, every record one that
``make_record`` can draw, every position below ``L`` -- and refuses, as one ``error:`` line, data
that is not the row's layout, read from its record (``protocol.ROWS``): the source,
placement, pieces, loss weight, prompt set and terminal length its flags name; terminals at
``L - b`` (fixed placement, and a prompt terminal under PoSE's law), drawn in ``[a, L - b]``
(random), no jump (``contiguous`` rows; (g1n) cut to (g1p)'s ``a < P``), PoSE's first chunk
``<= ceil(a/2)`` and its text skip; and the plain data of ``padded`` rows (one ``L``-token
document per sequence), ``packed`` rows (a stream of unpadded documents in ``L``-token
windows) and ``stream`` rows (no sidecar).
"""

from __future__ import annotations

import os

import numpy as np

from benchmarks.replication import controls
from benchmarks.replication import run
from benchmarks.replication.protocol import ROWS


def _flag(flags: list[str], name: str, default: str | None = None) -> str | None:
    return flags[flags.index(name) + 1] if name in flags else default


def build(rep, m: str, tag: str, seed: int, *, terminal: int, w: float) -> dict:
    """Write row ``m``'s training data (``protocol.ROWS[m]``) for fine-tuning seed ``seed``;
    returns the ``train_argv`` keywords (``seq``, ``target``, ``mb``, ``data_prefix``, ...)."""
    c, r = rep.c, ROWS[m]
    if r.plain == "padded":  # one document per L-token sequence: the EOD padding not trained
        return dict(seq=rep.L, target=2 * rep.L, mb=1, data_prefix=rep.path(r.source),
                    replay=True, eod_mask=True)
    if r.plain == "packed":  # the stream packed in L-token windows, no padding: every token
        return dict(seq=rep.L, target=2 * rep.L, mb=1, data_prefix=rep.path(r.source),
                    replay=True)
    if r.plain == "stream":  # contiguous P-token windows of a document stream
        return dict(seq=rep.P, target=rep.L, mb=max(1, c["ft_docs"] // 2), replay=True,
                    data_prefix=rep.path(r.source))
    from megatron_endprompt.cli import preprocess
    from megatron_endprompt.data.sidecar.sidecar import sidecar_path

    prefix = rep.path(f"ft_{tag}")
    flags = r.flags(terminal=terminal, weight=w, prompt_weight=c["prompt_w"])
    # (g1n): (g1p)'s context length a as the whole sample: (g1p)'s cut points, no terminal
    seq = controls.prompt_context_length(c, rep.spm) if r.seq == "a" else rep.P
    run.tool(preprocess.main, [
        "--input", rep.path(r.source), "--output-prefix", prefix,
        "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", rep.spm,
        "--seq-length", str(seq), "--target-length", str(rep.L), "--append-eod",
        "--workers", "1", "--no-progress", "--seed", str(1000 + seed), *flags])
    if r.contiguous:  # positions made contiguous ((d0): (d)'s own samples, same seed)
        controls.make_contiguous(sidecar_path(prefix))
    return dict(seq=seq, target=rep.L, mb=max(1, c["ft_docs"] // 2), data_prefix=prefix)


def check(m: str, kw: dict, c: dict, *, terminal: int, w: float) -> str:
    """Refuse data that is not method ``m``'s layout (one ``error:`` line); returns a summary."""
    from megatron_endprompt.data.sidecar.indexed_io import IndexReader
    from megatron_endprompt.data.prepare.prompts import PROMPT_SETS
    from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
    from megatron_endprompt.data.sidecar.sidecar_checks import check_records
    from megatron_endprompt.layout import positions_from_record

    prefix, L, P = kw["data_prefix"], c["L"], c["P"]

    def need(ok, why: str) -> None:
        if not ok:
            raise SystemExit(f"error: method ({m}): {prefix}: {why}; its layout is broken "
                             "(benchmarks/replication/layouts.py)")
    r = ROWS[m]
    if r.plain:
        need(not os.path.exists(sidecar_path(prefix)), "plain data has a sidecar")
        lengths = np.asarray(IndexReader(prefix + ".idx").sequence_lengths)
        need(len(lengths) > 0, "no document")
        if r.plain == "padded":
            need(np.all(lengths == L), f"full-length documents are not padded to L = {L}")
        if r.plain == "packed":  # documents with their one EOD each, unpadded: all text
            idx = IndexReader(prefix + ".idx")
            tokens = np.memmap(prefix + ".bin", dtype=idx.dtype, mode="r")  # 2 per doc read
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
    top = max(int(positions_from_record(record, seq).max()) for record in rec)
    need(top <= L - 1, f"a position {top} >= L")
    a, T = rec[:, 0], rec[:, 1]
    jumped = T > a
    flags = r.flags(terminal=terminal, weight=w, prompt_weight=c["prompt_w"])
    placement, source = _flag(flags, "--placement"), _flag(flags, "--terminal-source")
    chunks = 2 if placement == "pose" else int(_flag(flags, "--pose-chunks", "1"))
    want = (source, placement, chunks)
    need((h.terminal_source, lay.placement, lay.pose_chunks) == want,
         f"source/placement/pieces {h.terminal_source}/{lay.placement}/{lay.pose_chunks}, "
         f"not {'/'.join(map(str, want))}")
    weight = float(_flag(flags, "--terminal-loss-weight"))
    need(lay.loss_weights.terminal == weight and lay.loss_weights.context == 1.0,
         f"loss weights {lay.loss_weights.terminal}/{lay.loss_weights.context}, not {weight}/1")
    if source == "prompt":
        names = PROMPT_SETS[_flag(flags, "--terminal-prompts")]
        need(tuple(h.prompts) == tuple(names), f"prompts {h.prompts}, not {list(names)}")
    else:
        b = int(_flag(flags, "--terminal-length"))
        need(h.terminal_length == b, f"terminal length {h.terminal_length}, not {b}")
    if r.contiguous:
        need(not jumped.any(), "a position jump")
    elif placement == "fixed" or (placement == "pose" and source == "prompt"):
        need(jumped.any() and np.all(T[jumped] == L - (P - a[jumped])),
             "terminals not at L - b")
    elif placement == "random":
        need(jumped.any() and np.any(T[jumped] < L - (P - a[jumped])), "no random terminal")
    if r.seq == "a":
        need(seq < P, f"(g1p)'s context length a = {seq} is not below P = {P}")
    if placement == "pose":  # PoSE's law over the context: a first chunk of U{1..ceil(a/2)}
        top_r1 = (a + 1 + (source == "continuation")) // 2
        need(np.all((rec[:, 2] >= 1) & (rec[:, 2] <= top_r1)),
             "a first chunk outside 1..ceil(a/2)")
        stats = h.stats.get("pose", {})
        need(stats.get("samples") == len(rec) and stats.get("text_skip_mean", 0) > 0,
             "no text skip at the cut")
    return (f"({m}) {h.terminal_source}/{lay.placement}/N={lay.pose_chunks}: {len(rec)} "
            f"samples, {int(jumped.sum())} jumped, max position {top}")
