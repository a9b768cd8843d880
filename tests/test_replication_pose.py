"""Row (e) of the mini-replication draws PoSE's law (``dwzhu-pku/PoSE`` ``src/train_pose.py``):
per document, a first chunk of ``U{1..ceil(P/2)}`` tokens, a text skip ``U{0..n-P}`` at the
cut, a position skip ``U{0..L-P}``, every position ``<= L - 1``; fixed seeds."""

from __future__ import annotations

import numpy as np
import pytest
from spm_layout import SPM_L, SPM_P

from benchmarks.replication import pose
from megatron_endprompt.data.sidecar.sidecar_checks import check_records
from megatron_endprompt.layout import LayoutConfig, positions_from_record


def test_the_chunk_and_skip_laws_are_poses():
    P, L, n = 64, 512, 200
    draws = [pose.pose_draw(np.random.default_rng((3, j)), n, P, L) for j in range(4000)]
    r1 = np.array([d.r1 for d in draws])
    assert r1.min() == 1 and r1.max() == (P + 1) // 2  # U{1 .. ceil(P/2)}, both ends reached
    counts = np.bincount(r1, minlength=P // 2 + 1)[1:]
    assert counts.min() > 0.6 * len(draws) / (P // 2)  # uniform, not piled at one end
    assert abs(r1.mean() - (1 + P // 2) / 2) < 0.5
    text_skip = np.array([d.l2 - d.r1 for d in draws])
    assert text_skip.min() == 0 and text_skip.max() == n - P  # U{0 .. n - P}
    assert abs(text_skip.mean() - (n - P) / 2) < 3
    for d in draws:  # the second chunk fills the window: P inputs in all
        assert d.r1 + (d.r2 - d.l2) == P and d.r2 <= n
    k = np.array([d.k for d in draws])
    assert k.min() == 0 and k.max() == L - P and abs(k.mean() - (L - P) / 2) < 8
    long = pose.pose_draw(np.random.default_rng(0), 100 * P, P, L)  # truncated to 5P tokens
    assert long.r2 <= pose.TRUNCATE_WINDOWS * P
    assert max(pose.pose_draw(np.random.default_rng(s), 100 * P, P, L).r2
               for s in range(300)) > 4 * P


def test_samples_are_valid_two_piece_records_with_positions_below_L():
    P, L = 64, 512
    lengths = [P - 1, P, P + 1, 150, 400, 7 * P]  # text tokens; the first (n < P) is dropped
    ends = np.cumsum([n + 1 for n in lengths])  # + EOD each
    starts = np.concatenate([[0], ends[:-1]])
    records, ptr, pieces, dropped = pose.pose_samples(starts, ends, P=P, L=L, seed=5)
    assert dropped == 1 and len(records) == len(lengths) - 1
    layout = LayoutConfig(seq_length=P, target_length=L, placement="random", pose_chunks=2)
    assert check_records(records, layout, 1) is None  # what the trainer accepts
    assert np.array_equal(ptr, np.arange(0, 2 * len(records) + 1, 2))
    for rec, (p0, p1), (s, e) in zip(records, pieces.reshape(-1, 2, 2), zip(starts[1:], ends[1:])):
        pos = positions_from_record(rec, P)
        r1, k = int(rec[2]), int(rec[1]) - (P - 1)
        assert pos.max() <= L - 1 and np.all(np.diff(pos) >= 1)
        assert np.array_equal(pos[:r1], np.arange(r1))  # first chunk at 0..r1-1
        assert np.array_equal(pos[r1:], np.arange(r1 + k, P + k))  # second chunk after skip k
        assert p0[0] == s and p0[1] == r1  # the document's first r1 tokens
        assert p1[0] >= s + r1 and p1[0] + p1[1] <= e  # after the text skip, inside the doc
        assert p0[1] + p1[1] == P + 1
    assert np.any(pieces[1::2, 0] > pieces[0::2, 0] + pieces[0::2, 1])  # a text skip happens


def test_preprocessed_pose_samples_read_back_with_the_text_skip(run_tool, spm_args, tmp_path):
    from megatron_endprompt.cli import preprocess as preprocess_cli
    from megatron_endprompt.data.sidecar.indexed_io import CorpusReader
    from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
    from megatron_endprompt.data.sidecar.spans import sample_reader

    prefix = str(tmp_path / "e")
    rc, _, err = run_tool(preprocess_cli.main, spm_args(prefix, *pose.PREPROCESS_FLAGS))
    assert rc == 0, err
    counters = pose.write_pose_sidecar(prefix, seed=7)
    sc = read_sidecar(sidecar_path(prefix), prefix=prefix)  # verified, spans included
    docs = CorpusReader(prefix)
    long_docs = [j for j in range(len(docs)) if len(docs[j]) - 1 >= SPM_P]
    assert sc.header.num_samples == len(long_docs) == counters["samples"]
    assert counters["documents_dropped_shorter_than_P"] == len(docs) - len(long_docs)
    read = sample_reader(prefix, sc)
    skipped = 0
    for i, j in enumerate(long_docs):
        doc = np.asarray(docs[j])
        d = pose.pose_draw(np.random.default_rng((7, j)), len(doc) - 1, SPM_P, SPM_L)
        want = np.concatenate([doc[: d.r1], doc[d.l2 : d.r2 + 1]])
        assert np.array_equal(np.asarray(read(i)), want)
        assert positions_from_record(np.asarray(sc.records[i]), SPM_P).max() <= SPM_L - 1
        skipped += d.l2 > d.r1
    assert skipped > 0


def test_a_sidecar_of_another_layout_is_refused(run_tool, spm_args, tmp_path):
    from megatron_endprompt.cli import preprocess as preprocess_cli

    prefix = str(tmp_path / "d")
    rc, _, err = run_tool(preprocess_cli.main, spm_args(prefix, "--terminal-source",
                                                        "document-tail"))
    assert rc == 0, err
    with pytest.raises(ValueError, match="PoSE needs"):
        pose.write_pose_sidecar(prefix, seed=0)
