"""Sharded preprocessing and merging (one process per machine, then one prefix): shards merged equal
one run's tokens, valid layouts, random draws that differ between shards; mismatched shards
refused."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from megatron_endprompt.cli import merge as merge_cli
from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.sidecar.sidecar import read_sidecar
from megatron_endprompt.data.sidecar.spans import sample_reader, sidecar_pieces
from megatron_endprompt.errors import run_cli
from megatron_endprompt.layout import positions_from_record

P, L, B = 64, 512, 8  # tests/conftest.py spm_args
FLAGS = ("--placement", "random", "--pose-chunks", 2, "--seed", 7)


@pytest.fixture(scope="module")
def shards(spm_args, tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    one = str(root / "one")
    assert run_cli(preprocess_cli.main, spm_args(one, *FLAGS)) == 0
    out = str(root / "sharded")
    for i in range(3):
        assert run_cli(preprocess_cli.main, spm_args(out, *FLAGS, "--partitions", 3,
                                                     "--partition-index", i)) == 0
    return root, one, [f"{out}_part{i}_of_3" for i in range(3)]


def test_merged_shards_equal_one_run(shards, run_tool):
    root, one, parts = shards
    merged = str(root / "merged")
    rc, out, err = run_tool(merge_cli.main, ["--inputs", *parts, "--output-prefix", merged])
    assert rc == 0, err
    for suffix in (".bin", ".idx"):  # the same tokenized documents, byte for byte
        assert open(merged + suffix, "rb").read() == open(one + suffix, "rb").read()
    sc = read_sidecar(merged + ".endprompt", prefix=merged)
    shard_scs = [read_sidecar(p + ".endprompt", prefix=p) for p in parts]
    assert sc.header.num_samples == sum(s.header.num_samples for s in shard_scs)
    assert np.array_equal(np.asarray(sc.records),
                          np.concatenate([np.asarray(s.records) for s in shard_scs]))
    # sidecar v2: header checksum recomputed (read_sidecar checked it), tokenizer identity kept
    from megatron_endprompt.data.tokenize.tokenizer_identity import TokenizerIdentity

    assert TokenizerIdentity.from_dict(sc.header.tokenizer).is_known
    assert sc.header.tokenizer == shard_scs[0].header.tokenizer
    assert not any(f.endswith(".lock") or ".tmp-" in f for f in os.listdir(root))
    # every merged sample is the shard's sample (spans shifted into the merged stream) and a
    # contiguous continuation window of the merged corpus
    tokens = sample_reader(merged, sc)
    ptr, pieces = sidecar_pieces(sc)
    assert sc.header.sources["layout"] == "windows" and len(sc.sources) == 2 * 3  # 3 runs
    assert np.array_equal(ptr, np.arange(len(pieces) + 1))
    stream = np.fromfile(merged + ".bin", dtype=np.uint16)
    k = 0
    for p, s in zip(parts, shard_scs):
        shard_tokens = sample_reader(p, s)
        for i in range(s.header.num_samples):
            t = tokens(k)
            assert np.array_equal(t, shard_tokens(i))
            start = int(pieces[k, 0])
            assert np.array_equal(t, stream[start : start + P + 1])
            pos = positions_from_record(sc.records[k], P)
            assert pos[-1] < L and np.all(np.diff(pos) > 0)
            k += 1


def test_shards_draw_distinct_layouts(shards):
    """Regression: two shards with the same seed drew identical terminal starts."""
    _, _, parts = shards
    recs = [np.asarray(read_sidecar(p + ".endprompt").records) for p in parts]
    n = min(map(len, recs))
    assert n > 5
    for i in range(3):
        for j in range(i + 1, 3):
            assert not np.array_equal(recs[i][:n, 1], recs[j][:n, 1])
    seeds = {read_sidecar(p + ".endprompt").header.seed for p in parts}
    assert len(seeds) == 3


def test_merge_refuses_other_layout(shards, spm_args, run_tool, tmp_path):
    root, _, parts = shards
    other = str(tmp_path / "other")
    assert run_cli(preprocess_cli.main, spm_args(other, *FLAGS, "--target-length", 1024)) == 0
    out = str(tmp_path / "m")
    rc, _, err = run_tool(merge_cli.main, ["--inputs", parts[0], other, "--output-prefix", out])
    assert rc == 2 and err.count("\n") == 1 and err.startswith(f"error: --inputs {other}: layout")
    assert "target_length" in err
    assert not any((tmp_path / n).exists() for n in ("m.bin", "m.idx", "m.endprompt"))


def test_merge_refuses_other_tokenizer(shards, spm_args, spm_corpus, run_tool, tmp_path):
    _, _, parts = shards
    other = str(tmp_path / "null")
    corpus = tmp_path / "ints.jsonl"
    rng = np.random.default_rng(0)
    corpus.write_text("".join(json.dumps({"text": " ".join(map(str, rng.integers(0, 300, 90)))})
                              + "\n" for _ in range(8)))
    argv = spm_args(other, *FLAGS, "--tokenizer-type", "NullTokenizer", "--vocab-size", 399,
                    inputs=[str(corpus)])
    assert run_cli(preprocess_cli.main, argv) == 0
    rc, _, err = run_tool(merge_cli.main, ["--inputs", parts[0], other, "--output-prefix",
                                           str(tmp_path / "m")])
    assert rc == 2 and err.count("\n") == 1 and "tokenizer" in err


def test_partition_flags(spm_args, run_tool, tmp_path):
    rc, _, err = run_tool(preprocess_cli.main, spm_args(tmp_path / "x", "--partitions", 2))
    assert rc == 2 and err.count("\n") == 1 and "--partition-index" in err
    rc, _, err = run_tool(preprocess_cli.main, spm_args(tmp_path / "x", "--partitions", 2,
                                                        "--partition-index", 2))
    assert rc == 2 and err.count("\n") == 1 and "--partition-index 2" in err


def test_partition_reports_true_line_numbers(spm_args, spm_corpus, run_tool, tmp_path):
    """A partition starting mid-file still names the bad line by its number in the file."""
    lines = open(spm_corpus.path, encoding="utf-8").readlines()
    bad = len(lines) - 3
    lines[bad] = "{not json\n"
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text("".join(lines), encoding="utf-8")
    rc, _, err = run_tool(preprocess_cli.main, spm_args(tmp_path / "x", "--partitions", 2,
                                                        "--partition-index", 1,
                                                        inputs=[str(corpus)]))
    assert rc == 2 and err.startswith(f"error: {corpus}:{bad + 1}: malformed JSON")
