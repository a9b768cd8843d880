"""The mini-replication's rows that answer the paper's headline on its terms: full-length
fine-tuning at equal tokens on the same document stream ((hd), (hg): no padding, the tokens per
step of the ``P``-token rows), and the content-free terminal's null (g1n) cut at (g1p)'s own
points, so both get the same short-range supervision. Built in-process at the smoke sizes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.replication import controls
from benchmarks.replication import data_stats
from benchmarks.replication import layouts
from benchmarks.replication import mini_replication as mini
from benchmarks.replication import report
from benchmarks.replication import run


@pytest.fixture(scope="module")
def rep(tmp_path_factory):
    """A smoke-size work directory with the fine-tuning data of every row (no training)."""
    work = tmp_path_factory.mktemp("rows")
    c = dict(mini.SIZES["smoke"])
    c["ratio"] = -(-c["L"] // c["L0"])
    c["methods"] = "d,g1p,g1n,hd,hg"
    c["ft_docs"] = 6  # 6 x P = 2 x L: equal tokens per step is possible at these sizes
    r = mini.Replication(c, str(work), resume=False)
    from benchmarks.replication import data

    data.make_tokenizer(str(work), vocab_size=c["vocab"], num_docs=200,
                        split_digits=c["split_digits"])
    r.ft_data()
    return r


def _samples(prefix: str):
    from megatron_endprompt.data.sidecar.indexed_io import IndexReader
    from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path

    idx = IndexReader(prefix + ".idx")
    tokens = np.fromfile(prefix + ".bin", dtype=idx.dtype)
    ends = np.cumsum(idx.sequence_lengths)
    docs = [tokens[e - n:e] for e, n in zip(ends, idx.sequence_lengths)]
    return docs, np.asarray(read_sidecar(sidecar_path(prefix), prefix=prefix).records)


def test_g1n_is_g1p_without_its_terminal(rep):
    """(g1n) trains (g1p)'s contexts -- the same cut points in the same stream, as many
    samples -- with contiguous positions and no terminal; before, it cut ``P``-token windows
    and so held whole documents more often than (g1p)."""
    kw_p = layouts.build(rep, "g1p", "g1p_seed0", 0, terminal=48, w=1.0)
    kw_n = layouts.build(rep, "g1n", "g1n_seed0", 0, terminal=48, w=1.0)
    a = controls.prompt_context_length(rep.c, rep.spm)
    assert kw_n["seq"] == a < rep.P
    for m, kw in (("g1p", kw_p), ("g1n", kw_n)):
        layouts.check(m, kw, rep.c, terminal=48, w=1.0)
    docs_p, rec_p = _samples(kw_p["data_prefix"])
    docs_n, rec_n = _samples(kw_n["data_prefix"])
    assert abs(len(docs_p) - len(docs_n)) <= 1 and len(docs_p) > 10
    for sp, sn in zip(docs_p, docs_n):
        assert np.array_equal(sp[:a], sn[:a])  # the same a context tokens, sample by sample
    assert np.all(rec_n[:, 1] == rec_n[:, 0]) and np.all(rec_p[:, 0] == a)
    st = data_stats.collect(rep, ["g1p", "g1n"])
    assert st["g1p"]["whole_doc_share"] == st["g1n"]["whole_doc_share"]


def test_equal_token_rows_pack_the_stream_with_the_tokens_per_step_of_d(rep, monkeypatch):
    """(hd) and (hg) pack the same documents as (d) and (g1p) into ``L``-token windows (no EOD
    padding) and train as many tokens per step and as many steps."""
    monkeypatch.setattr(run, "train", lambda name, argv, work: {"argv": argv})
    monkeypatch.setattr(mini.Replication, "export_eval", lambda self, *a, **k: {})
    rep.base_ckpt = rep.path("ckpt_base")  # never read: training is replaced
    rows = {m: rep.method(m, 0) for m in ("d", "hd", "hg")}
    for m, stream in (("hd", "ft_stream"), ("hg", "g1_plain")):
        argv = rows[m]["argv"]
        assert argv[argv.index("--data-path") + 1] == rep.path(stream)
        assert argv[argv.index("--seq-length") + 1] == str(rep.L)
        assert "--eod-mask-loss" not in argv  # nothing is padding
        assert rows[m]["tokens_per_step"] == rows["d"]["tokens_per_step"]
        assert rows[m]["steps"] == rows["d"]["steps"]
        layouts.check(m, layouts.build(rep, m, f"{m}_x", 0, terminal=48, w=1.0), rep.c,
                      terminal=48, w=1.0)


def test_whole_document_share_counts_documents_inside_one_window():
    lengths = np.array([3, 3, 3, 3])
    assert data_stats.whole_share(lengths, 6) == 1.0
    assert data_stats.whole_share(lengths, 4) == 0.5  # [0,3) and [9,12) whole; two straddle


def test_the_report_pairs_the_papers_comparisons_and_writes_partial_blocks(tmp_path):
    assert ("d", "hd") in mini.PAIRS and ("g1p", "hg") in mini.PAIRS
    assert ("g1p", "g1n") in mini.PAIRS and ("d", "d0") in mini.PAIRS

    def ev(acc):
        return {"counts": {t: {"640": [round(100 * acc), 100]}
                           for t in ("niah_single_1", "passkey")}}
    c = dict(mini.SIZES["full"], seeds=3, lengths="640", held_out="")
    methods = {m: {"name": mini.METHODS[m], "seeds": {
        str(k): {**ev(0.5 + 0.1 * k + (0.2 if m == "d" else 0)), "tokens_per_step": 1280,
                 "steps": 300, "step_ms": 10.0} for k in range(2)}} for m in ("d", "hd")}
    results = {"config": c, "methods": methods, "base": {"eval": ev(0.1)},
               "data": {"d": {"docs_per_step": 8.0, "whole_doc_share": None, "window": 160},
                        "hd": {"docs_per_step": 3.2, "whole_doc_share": 0.56, "window": 640}},
               "seeds_done": 2}
    mini.summarize(results, c)
    d = results["paired"]["d-hd"]["niah_single_1"]["640"]
    assert d["mean"] == pytest.approx(0.2)
    written = mini.write(results, str(tmp_path / "r.json"), partial=True)
    assert written[0].endswith("r_partial.json")
    md = open(written[1], encoding="utf-8").read()
    assert "2 seed(s) of 3 (partial)" in md and "| (hd) " in md and "56.0%" in md
    assert "step vs (hd)" in report.main_table(results)
    assert json.load(open(written[0]))["seeds_done"] == 2


def test_pose_rows_are_the_tools_pose_layouts(rep):
    """(e) PoSE and (etp) the paper's ET(PoSE) are built by preprocessing's own
    ``--placement pose`` (no benchmark rewrite of the sidecar): PoSE's law, and for (etp) the
    EP1 prompt at ``L - b`` with ``w = 0.1``, every context position below the terminal."""
    from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
    from megatron_endprompt.layout import positions_from_record

    for m, source in (("e", "continuation"), ("etp", "prompt")):
        kw = layouts.build(rep, m, f"{m}_seed0", 0, terminal=48, w=1.0)
        assert f"({m}) {source}/pose/N=2" in layouts.check(m, kw, rep.c, terminal=48, w=1.0)
        sc = read_sidecar(sidecar_path(kw["data_prefix"]), prefix=kw["data_prefix"])
        assert sc.layout.placement == "pose"
        for r in np.asarray(sc.records):
            pos = positions_from_record(r, rep.P)
            assert pos[: r[0]].max() < r[1] and pos.max() <= rep.L - 1
        if m == "etp":
            assert sc.layout.loss_weights.terminal == rep.c["prompt_w"]


def test_rerender_recomputes_the_pairs_of_a_committed_json(tmp_path):
    """``--rerender`` recomputes the summaries and today's PAIRS of a results JSON (e.g. one
    written before a pair was added) and rewrites its tables; it trains nothing."""
    def ev(acc):
        return {"counts": {t: {"640": [acc, 100]} for t in ("niah_single_1", "passkey")}}
    c = dict(mini.SIZES["full"], seeds=2, lengths="640", held_out="")
    results = {"config": c, "base": {"eval": ev(10)}, "methods": {
        m: {"name": mini.METHODS[m], "seeds": {str(k): ev(50 + 10 * k + bump) for k in range(2)}}
        for m, bump in (("g1n", 20), ("hg", 0))}}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(results))
    assert mini.main(["--rerender", str(path)]) == 0
    out = json.loads(path.read_text())
    assert out["paired"]["g1n-hg"]["passkey"]["640"]["mean"] == pytest.approx(0.2)
    assert "(g1n) - (hg)" in (tmp_path / "old.md").read_text()


def test_a_new_row_is_one_record_in_the_table(rep, monkeypatch):
    """The runner reads a row from its ``RowSpec`` alone: a record added to ``ROWS`` (here (c)'s
    layout under another name) is built, checked and sized with no code of its own."""
    from benchmarks.replication import protocol
    from benchmarks.replication.rows import RowSpec

    c = protocol.ROWS["c"]
    monkeypatch.setitem(protocol.ROWS, "c2", RowSpec(key="c2", label="(c) again",
                                                     source=c.source, layout=c.layout))
    kw = layouts.build(rep, "c2", "c2_seed0", 0, terminal=48, w=0.5)
    assert "(c2) document-tail/fixed/N=1" in layouts.check("c2", kw, rep.c, terminal=48, w=0.5)
    with pytest.raises(SystemExit, match=r"method \(c2\).*loss weights"):
        layouts.check("c2", kw, rep.c, terminal=48, w=1.0)  # its flags name w = 1 now


def test_rows_are_typed_keyword_only_frozen_records():
    import dataclasses

    from benchmarks.replication import extension, protocol
    from benchmarks.replication.rows import RowSpec

    for table in (protocol.ROWS, extension.ROWS):
        for k, r in table.items():
            assert isinstance(r, RowSpec) and r.key == k
    with pytest.raises(TypeError):
        RowSpec("x", "positional")  # keyword-only
    with pytest.raises(dataclasses.FrozenInstanceError):
        protocol.ROWS["d"].seq = "L"
    with pytest.raises(ValueError, match="layout or is plain"):
        RowSpec(key="x", label="x", source="ft.jsonl")
    assert protocol.ROWS["etp"].reconstruction and extension.ROWS["etpose"].reconstruction
    assert [k for k, r in protocol.ROWS.items() if r.equal_tokens] == ["h", "hd", "hg"]
    assert protocol.ROWS["hd"].sequences_per_step(8, P=160, L=640) == 2


def test_the_runners_dispatch_through_the_table_not_letter_codes():
    """No ``if m in (...)`` / ``m == "x"`` branches on row names in the runners, and no ``w``
    naming both the work-directory path helper and the loss weight."""
    import inspect
    import re

    from benchmarks.replication import controls, extension

    for mod in (layouts, mini, run, controls, extension):
        src = inspect.getsource(mod)
        assert not re.search(r"\b(m|method) (not )?in \(", src), mod.__name__
        assert not re.search(r"\b(m|method) [!=]= \"", src), mod.__name__
    assert not hasattr(mini.Replication, "w") and hasattr(mini.Replication, "path")
