"""The numpy .bin/.idx reader/writer against Megatron-Core's IndexedDatasetBuilder/_IndexReader."""

import numpy as np
import pytest
import torch
from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder, _IndexReader

from megatron_endprompt.data.sidecar.indexed_io import (DTYPE_CODES, CorpusReader, IndexedWriter,
                                                IndexReader, optimal_dtype)
from megatron_endprompt.errors import UserError


def _docs(rng, dtype, n=7):
    hi = 120 if np.dtype(dtype).itemsize == 1 else 30000
    return [rng.integers(0, hi, size=int(rng.integers(1, 40))) for _ in range(n)]


def _write_both(tmp_path, name, dtype, docs):
    ours, theirs = tmp_path / f"{name}_ours", tmp_path / f"{name}_meg"
    w = IndexedWriter(f"{ours}.bin", dtype)
    b = IndexedDatasetBuilder(f"{theirs}.bin", dtype=dtype)
    for d in docs:
        cut = [len(d)] if len(d) < 3 else [2, len(d) - 2]  # several sequences per document too
        w.add_document(d, cut)
        b.add_document(torch.tensor(d), cut)
    w.finalize(f"{ours}.idx")
    b.finalize(f"{theirs}.idx")
    return str(ours), str(theirs)


def _same_files(a, b):
    for suffix in (".bin", ".idx"):
        with open(a + suffix, "rb") as fa, open(b + suffix, "rb") as fb:
            assert fa.read() == fb.read(), suffix


@pytest.mark.parametrize("dtype", [np.dtype(t).type for t in DTYPE_CODES])
def test_writer_is_byte_identical_to_megatron_on_every_dtype(tmp_path, dtype):
    assert DTYPE_CODES[np.dtype(dtype)] == DType.code_from_dtype(dtype)
    docs = _docs(np.random.default_rng(0), dtype)
    ours, theirs = _write_both(tmp_path, "c", dtype, docs)
    _same_files(ours, theirs)
    mine, meg = IndexReader(ours + ".idx"), _IndexReader(theirs + ".idx", multimodal=False)
    assert mine.dtype == np.dtype(meg.dtype)
    for field in ("sequence_lengths", "sequence_pointers", "document_indices"):
        np.testing.assert_array_equal(getattr(mine, field), getattr(meg, field))
    reader = CorpusReader(ours)
    flat = np.concatenate(docs).astype(dtype)
    np.testing.assert_array_equal(np.concatenate([reader[i] for i in range(len(reader))]), flat)


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_add_index_merge_is_byte_identical(tmp_path, dtype):
    rng = np.random.default_rng(1)
    shards = [_write_both(tmp_path, f"s{k}", dtype, _docs(rng, dtype, n=3 + k))[0]
              for k in range(3)]
    w = IndexedWriter(str(tmp_path / "m_ours.bin"), dtype)
    b = IndexedDatasetBuilder(str(tmp_path / "m_meg.bin"), dtype=dtype)
    for s in shards:
        w.add_index(s)
        b.add_index(s)
    w.finalize(str(tmp_path / "m_ours.idx"))
    b.finalize(str(tmp_path / "m_meg.idx"))
    _same_files(str(tmp_path / "m_ours"), str(tmp_path / "m_meg"))


def test_empty_corpus_matches(tmp_path):
    ours, theirs = _write_both(tmp_path, "e", np.uint16, [])
    _same_files(ours, theirs)
    assert len(IndexReader(ours + ".idx")) == 0


def test_optimal_dtype_is_megatrons():
    for vocab in (None, 100, 65499, 65500, 128256):
        assert optimal_dtype(vocab) == np.dtype(DType.optimal_dtype(vocab))


@pytest.mark.parametrize("blob,words", [(b"", "only 0 bytes"),
                                        (b"NOTANIDX" + bytes(40), "bad magic"),
                                        (b"MMIDIDX\x00\x00" + (2).to_bytes(8, "little") + bytes(17),
                                         "version 2"),
                                        (b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + b"\x09"
                                         + bytes(16), "dtype code 9"),
                                        (b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + b"\x08"
                                         + (5).to_bytes(8, "little") + (6).to_bytes(8, "little"),
                                         "truncated")])
def test_bad_idx_is_one_user_error(tmp_path, blob, words):
    path = tmp_path / "x.idx"
    path.write_bytes(blob)
    with pytest.raises(UserError, match=words):
        IndexReader(str(path))
