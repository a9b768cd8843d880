"""``--placement pose``: PoSE's law (``dwzhu-pku/PoSE`` ``src/train_pose.py``) as a layout of
preprocessing and sidecar building -- PoSE itself (continuation) and ET(PoSE) with PoSE's law
(a prompt at ``L - b``) -- with the sidecar's invariants, ``inspect`` and bad flags in one line.

The law is compared with a reference written here from train_pose.py's documented draw (Python's
``random``, as PoSE draws): first-chunk, text-skip and position-skip means within 2% on 20,000
documents."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from tests.support.layout import SPM_L, SPM_P

from benchmarks.replication import pose as bench_pose
from megatron_endprompt.cli import build_sidecar as build_sidecar_cli
from megatron_endprompt.cli import inspect as inspect_cli
from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.sidecar.sidecar_checks import check_records, validate_header
from megatron_endprompt.errors import UserError
from megatron_endprompt.layout import LayoutConfig, positions_from_record, sample_rng

DRAWS = 20_000
P, L = 64, 512
#: Document lengths (tokens, EOD included): :data:`DRAWS` that hold the window (some past
#: 5 x P), and every 20th one below it (dropped).
LENGTHS = np.insert(np.random.default_rng(11).integers(P + 1, 7 * P, size=DRAWS),
                    np.arange(0, DRAWS, 20), np.random.default_rng(12).integers(2, P + 1,
                                                                                size=DRAWS // 20))


def reference_draw(rnd: random.Random, n_ids: int, p: int, target: int) -> tuple[int, int, int]:
    """train_pose.py's draw for one document of ``n_ids`` tokens, from its documented law:
    truncate to ``5p``; window ``w = min(n, p)``; first chunk ``randint(1, (w + 1) // 2)``;
    second chunk ending at ``randint(w, n)``; position offset ``randint(0, target - w)``.
    Returns (first chunk, text skip, position skip)."""
    n = min(n_ids, 5 * p)
    w = min(n, p)
    first = rnd.randint(1, (w + 1) // 2)
    end = rnd.randint(w, n)
    return first, end - w, rnd.randint(0, target - w)


def _samples(source: str, *, prompt_len: int = 11, seed: int = 7):
    """Records ``[m, 4]``, text skips ``[m]`` and contexts ``a`` of ``--placement pose`` over
    documents of :data:`LENGTHS` (fed as stream offsets, as the sidecar build does)."""
    from megatron_endprompt.data.prepare.samples import SampleMaker

    layout = LayoutConfig(seq_length=P, target_length=L, placement="pose", pose_chunks=2)
    prompt = source == "prompt"
    maker = SampleMaker(layout, terminal_source=source, terminal_length=None if prompt else 1,
                        prompts=[np.full(prompt_len, -2)] if prompt else None,
                        eod=-1 if prompt else None, seed=seed)
    records, skips, start = [], [], 0
    for n in LENGTHS.tolist():
        for tokens, record in maker.add_document(np.arange(start, start + n)):
            r1 = int(record[2])
            skips.append(int(tokens[r1] - tokens[r1 - 1] - 1))
            records.append(record)
        start += n
    return np.array(records, dtype=np.int64), np.array(skips), layout, maker.stats


def test_first_chunk_and_skip_means_match_train_pose_within_2_percent():
    records, text_skip, layout, stats = _samples("continuation")
    rnd = random.Random(5)
    # PoSE trains every document; ours drops those with fewer than P text tokens (counted)
    long = [n for n in LENGTHS.tolist() if n - 1 >= P]
    ref = np.array([reference_draw(rnd, n - 1, P, L) for n in long])
    assert len(records) == len(long) == DRAWS and stats.docs_dropped == DRAWS // 20
    ours = {"first chunk": records[:, 2], "text skip": text_skip,
            "position skip": records[:, 3] - records[:, 2]}
    for (name, got), want in zip(ours.items(), ref.T):
        assert abs(got.mean() - want.mean()) <= 0.02 * want.mean(), (name, got.mean(),
                                                                      want.mean())
        assert (got.min(), got.max()) == (want.min(), want.max()), name  # the same support
    assert check_records(records.astype(np.int32), layout, 1) is None


@pytest.mark.parametrize("source", ["continuation", "prompt"])
def test_every_context_position_is_below_the_terminal_start(source):
    records, _, layout, _ = _samples(source)
    a, T = records[:, 0], records[:, 1]
    assert check_records(records.astype(np.int32), layout,
                         None if source == "prompt" else 1) is None
    for rec in records:
        pos = positions_from_record(rec, P)
        assert pos[: rec[0]].max() < rec[1] and pos.max() <= L - 1
        assert np.all(np.diff(pos) >= 1)
    if source == "prompt":  # ET(PoSE): PoSE's two chunks over a, then the prompt at L - b
        assert np.all(T == L - (P - a)) and np.all(records[:, 2] <= (a + 1) // 2)
    else:  # PoSE: the last input continues the second chunk
        assert np.all(T == a + records[:, 3] - records[:, 2])


def _first_chunk_past_half(r):
    r[2:4] += (P + 1) // 2 + 1 - r[2]  # r1 = ceil(P/2) + 1, the same skip


def _terminal_after_the_second_chunk(r):
    r[1] += 1  # a one-position gap after the second chunk (T = a + k + 1 <= L - b)


@pytest.mark.parametrize("bad, needle", [(_first_chunk_past_half, "PoSE first chunk"),
                                         (_terminal_after_the_second_chunk, "PoSE terminal")])
def test_records_off_the_law_are_refused(bad, needle):
    records, _, layout, _ = _samples("continuation")
    records = records[:50].astype(np.int32)
    row = int(np.flatnonzero(records[:, 3] - records[:, 2] < L - P)[0])
    assert check_records(records, layout, 1) is None
    bad(records[row])
    found, why = check_records(records, layout, 1)
    assert found == row and needle in why, why


def _header(**over) -> dict:
    layout = LayoutConfig(seq_length=P, target_length=L, placement="pose", pose_chunks=2)
    return {"layout": layout.to_header(), "terminal_source": "continuation",
            "terminal_length": 1, "idx_sha256": "0" * 64, "idx_bytes": 100, "bin_bytes": 0,
            "records_crc32": 0, **over}


@pytest.mark.parametrize("over, needle", [
    (dict(terminal_source="document-tail"), "terminal_source='document-tail'"),
    (dict(terminal_length=40), "terminal_length=40"),
    (dict(layout={**_header()["layout"], "pose_chunks": 3}), "layout.pose_chunks=3"),
])
def test_a_header_off_the_pose_layout_is_refused(over, needle):
    validate_header(_header(), "x.endprompt")  # the good one passes
    with pytest.raises(UserError, match="invalid sidecar header") as exc:
        validate_header(_header(**over), "x.endprompt")
    assert needle in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("flags, needles", [
    (["--terminal-source", "document-tail"], ["--placement pose", "document-tail",
                                              "--terminal-source continuation"]),
    (["--pose-chunks", "3"], ["--placement pose", "--pose-chunks 3"]),
    (["--terminal-length", "40"], ["--terminal-length 40", "<= 31"]),
])
@pytest.mark.parametrize("tool", ["preprocess", "build_sidecar"])
def test_bad_flag_combinations_fail_in_one_line(tool, flags, needles, run_tool, spm_args,
                                                tmp_path):
    from tests.support.bad_input import _assert_one_error_line, _outputs

    prefix = tmp_path / "p"
    if tool == "preprocess":
        rc, _, err = run_tool(preprocess_cli.main, spm_args(prefix, "--placement", "pose",
                                                            *flags))
        assert _outputs(prefix) == []
    else:
        rc, _, err = run_tool(preprocess_cli.main, spm_args(prefix))
        assert rc == 0, err
        before = _outputs(prefix)
        rc, _, err = run_tool(build_sidecar_cli.main, [
            "--data-prefix", prefix, "--name", "bad", "--seq-length", SPM_P, "--target-length",
            SPM_L, "--terminal-length", 1, "--placement", "pose", *flags])
        assert _outputs(prefix) == before
    _assert_one_error_line(rc, err, *needles)


def test_preprocessed_pose_is_poses_samples_and_the_benchmarks(run_tool, spm_args, tmp_path):
    from megatron_endprompt.data.sidecar.indexed_io import CorpusReader, IndexReader
    from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
    from megatron_endprompt.data.sidecar.spans import sample_reader, token_stream_bounds

    prefix = str(tmp_path / "e")
    rc, out, err = run_tool(preprocess_cli.main, spm_args(prefix, *bench_pose.POSE_FLAGS,
                                                          "--seed", 9))
    assert rc == 0, err
    assert "PoSE (dwzhu-pku/PoSE" in out
    sc = read_sidecar(sidecar_path(prefix), prefix=prefix)  # verified: records and spans
    assert (sc.layout.placement, sc.layout.pose_chunks, sc.header.terminal_length) == \
        ("pose", 2, 1)
    docs = CorpusReader(prefix)
    long_docs = [j for j in range(len(docs)) if len(docs[j]) - 1 >= SPM_P]
    assert sc.header.num_samples == len(long_docs) == sc.header.stats["pose"]["samples"]
    assert sc.header.stats["documents_dropped"] == len(docs) - len(long_docs)
    read = sample_reader(prefix, sc)
    for i, j in enumerate(long_docs):
        doc = np.asarray(docs[j])
        d = bench_pose.pose_draw(sample_rng(9, j), len(doc) - 1, SPM_P, SPM_L)
        assert np.array_equal(np.asarray(read(i)), np.concatenate([doc[: d.r1],
                                                                   doc[d.l2 : d.r2 + 1]]))
    # the benchmark's rewrite of the same documents draws the very same samples
    starts, ends = token_stream_bounds(IndexReader(prefix + ".idx"), prefix,
                                       os.path.getsize(prefix + ".bin"))
    records, _, _, dropped = bench_pose.pose_samples(starts, ends, P=SPM_P, L=SPM_L, seed=9)
    assert np.array_equal(records, np.asarray(sc.records)) and dropped == len(docs) - len(long_docs)


def test_et_pose_prompt_samples_build_sidecar_and_inspect(run_tool, spm_args, spm_tokenizer,
                                                          tmp_path):
    from megatron_endprompt.data.sidecar.indexed_io import CorpusReader
    from megatron_endprompt.data.prepare.prompts import EP1, tokenize_prompt
    from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
    from megatron_endprompt.data.sidecar.spans import sample_reader

    prefix = str(tmp_path / "et")
    rc, _, err = run_tool(preprocess_cli.main, spm_args(prefix, *bench_pose.ET_POSE_FLAGS))
    assert rc == 0, err
    sc = read_sidecar(sidecar_path(prefix), prefix=prefix)
    ep1 = tokenize_prompt(EP1, spm_tokenizer)
    b = len(ep1)
    a = SPM_P - b
    rec = np.asarray(sc.records, dtype=np.int64)
    assert np.all(rec[:, 0] == a) and np.all(rec[:, 1] == SPM_L - b)
    assert np.all(rec[:, 2] <= (a + 1) // 2) and np.all(rec[:, 3] - rec[:, 2] <= SPM_L - SPM_P)
    assert sc.layout.loss_weights.terminal == 0.1
    docs, read = CorpusReader(prefix), sample_reader(prefix, sc)
    long_docs = [j for j in range(len(docs)) if len(docs[j]) - 1 >= a]
    assert len(rec) == len(long_docs)
    for i, j in enumerate(long_docs):
        tokens, doc = np.asarray(read(i)), np.asarray(docs[j])
        assert np.array_equal(tokens[a:SPM_P], ep1) and tokens[-1] == spm_tokenizer.eod
        r1 = int(rec[i, 2])
        assert np.array_equal(tokens[:r1], doc[:r1])
        pos = positions_from_record(rec[i], SPM_P)
        assert pos[:a].max() < SPM_L - b <= pos[a:].min()
    # an existing corpus: build_endprompt_sidecar.py draws the same layout
    rc, _, err = run_tool(build_sidecar_cli.main, [
        "--data-prefix", prefix, "--name", "again", "--seq-length", SPM_P, "--target-length",
        SPM_L, "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model",
        spm_tokenizer_model(spm_args), *bench_pose.ET_POSE_FLAGS, "--no-progress"])
    assert rc == 0, err
    again = read_sidecar(sidecar_path(prefix, "again"), prefix=prefix)
    assert np.array_equal(np.asarray(again.records), rec)
    rc, out, err = run_tool(inspect_cli.main, [prefix, "--index", 1])
    assert rc == 0, err
    assert "placement=pose, source=prompt, pose_chunks=2" in out
    assert "PoSE (dwzhu-pku/PoSE src/train_pose.py@" in out
    assert f"first chunk r1={rec[1, 2]}" in out
    assert f"-> positions {SPM_L - b}..{SPM_L - 1}" in out


def spm_tokenizer_model(spm_args) -> str:
    """The SentencePiece model path ``spm_args`` passes."""
    argv = spm_args("x")
    return argv[argv.index("--tokenizer-model") + 1]
