"""Spans sidecars at corpus scale (start-up per rank near stock Megatron's): readers never unpack
``sources`` (per-rank memory O(samples read)), the split's sample list and the full verification
stream over blocks of samples, a later start (every rank but the builder, every restart) touches no
per-sample table, and a tampered ``.idx`` is refused for a spans sidecar too. Samples are pinned
against the full unpack the readers used before (``_old_*`` below, kept here as the reference)."""

from __future__ import annotations

import pickle
import tracemalloc

import numpy as np
import pytest
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from test_build_sidecar import VOCAB, write_corpus
from test_corpus_sidecar import _build
from test_sidecar_trust import _tamper_idx

from megatron_endprompt.data import sample_index as sample_index_mod
from megatron_endprompt.data.sidecar import span_scan, spans
from megatron_endprompt.data.dataset import EndPromptDatasetConfig, EndPromptGPTDataset
from megatron_endprompt.data.sidecar.sidecar import (SidecarHeader, open_sidecar, verify_sidecar,
                                             write_sidecar)
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer
from megatron_endprompt.data.sidecar.trust import ensure_verified
from megatron_endprompt.errors import UserError
from megatron_endprompt.layout import LayoutConfig

P, L, B, EOD = 32, 256, 8, 999
PROMPTS = [[11, 12, 13], [EOD], [7, 8, 9, 10, 11]]


# -- the full unpack the readers did before streaming: the reference ---------------------------
def _old_unpack(sources, n, layout, seq):
    sources = np.asarray(sources, dtype=np.int64)
    if layout == "windows":
        runs = sources.reshape(-1, 2)
        run = np.searchsorted(runs[:, 0], np.arange(n), side="right") - 1
        starts = runs[run, 1] + (np.arange(n) - runs[run, 0]) * seq
        return np.arange(n + 1), np.stack([starts, np.full(n, seq + 1)], axis=1)
    return sources[: n + 1], sources[n + 1 :].reshape(-1, 2)


def _old_extent(ptr, pieces, n):
    owner = np.repeat(np.arange(n), np.diff(ptr))
    real = pieces[:, 0] >= 0
    first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.zeros(n, dtype=np.int64)
    np.minimum.at(first, owner[real], pieces[real, 0])
    np.maximum.at(last, owner[real], pieces[real, 0] + pieces[real, 1])
    return first, last


def _old_tokens(stream, ptr, pieces, i):
    parts = []
    for start, k in pieces[ptr[i] : ptr[i + 1]].tolist():
        parts.append(stream[start : start + k] if start >= 0 else
                     np.array([EOD]) if start == -1 else np.array(PROMPTS[-2 - start]))
    return np.concatenate(parts).astype(np.int64)


# -- synthetic spans sidecars -----------------------------------------------------------------
def _pieces_sources(rng, n, tokens):
    """Samples of random pieces: stream spans, EOD and prompt markers; P + 1 tokens each."""
    ptr, rows = [0], []
    for _ in range(n):
        left = P + 1
        while left:
            kind = int(rng.integers(4))
            if kind == 0:
                rows.append((-1, 1))
            elif kind == 1 and len(PROMPTS[k := int(rng.integers(3))]) <= left:
                rows.append((-2 - k, len(PROMPTS[k])))
            else:
                m = int(rng.integers(1, left + 1))
                rows.append((int(rng.integers(0, tokens - m)), m))
            left -= rows[-1][1]
        ptr.append(len(rows))
    return spans.join_sources(np.array(ptr), np.array(rows)), "pieces"


def _windows_sources(rng, n, tokens):
    firsts = np.concatenate([[0], np.sort(rng.choice(np.arange(1, n), n // 5, replace=False))])
    starts = rng.integers(0, tokens - (n + 1) * P - 1, len(firsts))
    return np.stack([firsts, starts], axis=1).ravel(), "windows"


def write_spans(path, sources, layout, n, bin_bytes):
    records = np.tile(np.array([P - B, L - B], dtype=np.int32), (n, 1))
    header = SidecarHeader(layout=LayoutConfig(seq_length=P, target_length=L).to_header(),
                           terminal_source="continuation", terminal_length=B, num_samples=n,
                           idx_sha256="0" * 64, idx_bytes=10**6, bin_bytes=bin_bytes,
                           sources={"kind": "spans", "layout": layout, "eod": EOD,
                                    "prompt_tokens": PROMPTS})
    write_sidecar(path, header, records, np.asarray(sources, dtype=np.int64))
    return open_sidecar(path)


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks and run directory far smaller than the sample count: every boundary is hit."""
    monkeypatch.setattr(spans, "BLOCK", 3)
    monkeypatch.setattr(spans, "_COARSE", 2)


@pytest.mark.parametrize("kind", ["pieces", "windows"])
def test_in_place_reads_equal_the_full_unpack(kind, tmp_path, small_blocks):
    rng = np.random.default_rng(3)
    n = 60
    tokens = (n + 2) * P * 3
    stream = rng.integers(0, VOCAB, tokens).astype(np.uint16)
    stream.tofile(tmp_path / "d.bin")
    sources, layout = (_pieces_sources if kind == "pieces" else _windows_sources)(rng, n, tokens)
    sc = write_spans(str(tmp_path / "d.endprompt"), sources, layout, n, 2 * tokens)
    verify_sidecar(sc)
    ptr, pieces = _old_unpack(sources, n, layout, P)
    index = spans.SpanIndex.of(sc)
    reader = spans.span_reader(str(tmp_path / "d"), sc, np.uint16)
    clone = pickle.loads(pickle.dumps(reader))  # a data-loader worker's copy: maps again
    assert len(pickle.dumps(reader)) < 2048
    for i in range(n):
        assert np.array_equal(index.pieces(i), pieces[ptr[i] : ptr[i + 1]])
        want = _old_tokens(stream, ptr, pieces, i)
        assert np.array_equal(reader.tokens(i).astype(np.int64), want)
        assert np.array_equal(clone.tokens(i).astype(np.int64), want)
    for lo, hi in [(0, n), (5, 6), (7, 40), (n - 1, n)]:
        p, pcs = index.block(lo, hi)
        assert np.array_equal(p, ptr[lo : hi + 1])
        assert np.array_equal(pcs, pieces[ptr[lo] : ptr[hi]])
    assert all(np.array_equal(a, b) for a, b in zip(spans.sidecar_pieces(sc), (ptr, pieces)))
    first, last = _old_extent(ptr, pieces, n)
    for lo, hi in [(0, np.iinfo(np.int64).max), (0, tokens // 2), (tokens // 3, tokens)]:
        assert np.array_equal(span_scan.samples_within(sc, lo, hi),
                              np.flatnonzero((first >= lo) & (last <= hi)))


@pytest.mark.parametrize("block", [3, 12])
def test_split_lists_share_one_pass(tmp_path, small_blocks, monkeypatch, block):
    """Three contiguous splits get the same samples whether the extent bounds of every step
    of samples come from verification, from an earlier split or are unknown; once known, a
    split reads only the steps that straddle its range (before: every split read every
    block), and a step, not a block (``block`` 12 = 4 steps of 3: before this, a corpus of
    one block was read whole by every split). Samples 0-29 are document-tail pairs (two pieces
    each: the column-wise path), 30-39 random pieces with EOD/prompt markers (``reduceat``)."""
    monkeypatch.setattr(spans, "BLOCK", block)
    monkeypatch.setattr(span_scan, "STEP", 3)
    rng = np.random.default_rng(5)
    n, tokens = 40, 44 * (P + 1)
    i = np.arange(30)
    pairs = np.stack([i * (P + 1), np.full(30, P + 1 - B), i * (P + 1) + P + 1 - B,
                      np.full(30, B)], axis=1).reshape(-1, 2)
    rand, _ = _pieces_sources(rng, 10, tokens)
    rptr, rrows = rand[:11], rand[11:].reshape(-1, 2)
    ptr = np.concatenate([np.arange(0, 60, 2), 60 + rptr])
    pieces = np.concatenate([pairs, rrows])
    sources = spans.join_sources(ptr, pieces)
    first, last = _old_extent(ptr, pieces, n)
    cuts = [0, 20 * (P + 1), 25 * (P + 1), np.iinfo(np.int64).max]
    want = [np.flatnonzero((first >= lo) & (last <= hi)) for lo, hi in zip(cuts, cuts[1:])]
    assert all(len(w) for w in want[:2])
    reads = []
    real_read = spans.SpanIndex.read
    monkeypatch.setattr(spans.SpanIndex, "read",
                        lambda self, lo, hi: reads.append((lo, hi)) or real_read(self, lo, hi))
    blocks = -(-n // block)
    for how in ("verified", "earlier split", "unknown"):
        sc = write_spans(str(tmp_path / f"{how[0]}.endprompt"), sources, "pieces", n,
                         2 * tokens)
        if how == "verified":
            verify_sidecar(sc)
            assert len(reads) == blocks
        elif how == "earlier split":
            span_scan.samples_within(sc, 0, tokens)
        for (lo, hi), w in zip(zip(cuts, cuts[1:]), want):
            if how == "unknown":
                sc.derived.clear()  # a fresh SpanIndex: no bounds
            reads.clear()
            assert np.array_equal(span_scan.samples_within(sc, lo, hi), w), (how, lo)
            if how == "unknown":
                assert len(reads) == blocks
            else:  # known: at most the step at each end of the range + the 4 random steps
                assert len(reads) <= 2 + 4 and all(z - a <= 3 for a, z in reads), (how, reads)


def _build_datasets(prefix, name, cache):
    tok = build_tokenizer(TokenizerSpec(tokenizer_type="NullTokenizer", vocab_size=VOCAB))
    config = EndPromptDatasetConfig(
        random_seed=1234, sequence_length=P, blend=([prefix], [1.0]), split="60,20,20",
        tokenizer=tok, reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, create_attention_mask=False, path_to_cache=str(cache),
        endprompt_target_length=L, endprompt_sidecar_name=name)
    built = BlendedMegatronDatasetBuilder(EndPromptGPTDataset, [50, 10, 10], lambda: True,
                                          config).build()
    return [getattr(ds, "datasets", [ds])[0] for ds in built]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("spans_scale") / "m")
    write_corpus(prefix, n_docs=90, seed=2)
    return prefix


def _sidecar(run_tool, prefix, name, *extra):
    """The named sidecar built by the CLI (same P, L, b as test_corpus_sidecar), opened."""
    return open_sidecar(_build(run_tool, prefix, name, *extra)[0])


@pytest.mark.parametrize("name,extra,layout", [
    ("cont", ("--placement", "random"), "windows"),
    ("tail", ("--terminal-source", "document-tail"), "pieces")])
def test_split_samples_and_later_start(corpus, run_tool, tmp_path, monkeypatch, name, extra,
                                       layout):
    """Each split's samples are those the full unpack selected (tokens too); a later start
    (every rank after the builder, every restart) reads them from the cache and never builds
    a per-sample table of the sidecar."""
    sc = _sidecar(run_tool, corpus, name, *extra)
    assert sc.header.sources["layout"] == layout
    monkeypatch.setattr(spans, "BLOCK", 4)
    first_start = _build_datasets(corpus, name, tmp_path / "cache")
    n = sc.header.num_samples
    ptr, pieces = _old_unpack(sc.sources, n, layout, P)
    first, last = _old_extent(ptr, pieces, n)
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    index = IndexedDataset(corpus).index
    starts = spans.sequence_starts(index, corpus, sc.header.bin_bytes)[:-1]
    first_doc = np.searchsorted(starts, first, side="right") - 1
    last_doc = np.searchsorted(starts, last - 1, side="right") - 1
    stream = np.fromfile(corpus + ".bin", dtype=np.uint16)
    for ds in first_start:
        lo, hi = int(np.min(ds.indices)), int(np.max(ds.indices))
        old_units = np.flatnonzero((first_doc >= lo) & (last_doc <= hi))
        assert np.array_equal(ds._units, old_units) and len(old_units)
        for i in range(0, len(ds), 7):
            k = int(ds.document_index[i])
            want = _old_tokens(stream, ptr, pieces, k)[:P]
            assert np.array_equal(ds[i]["tokens"].numpy(), want)

    def boom(*a, **k):
        raise AssertionError("a later start built a per-sample table")
    monkeypatch.setattr(spans.SpanIndex, "block", boom)
    monkeypatch.setattr(spans.SpanIndex, "read", boom)
    monkeypatch.setattr(span_scan, "samples_within", boom)
    monkeypatch.setattr(sample_index_mod, "samples_within", boom)
    later = _build_datasets(corpus, name, tmp_path / "cache")
    for a, b in zip(first_start, later):
        assert np.array_equal(np.asarray(a.document_index), np.asarray(b.document_index))
        for i in range(0, len(a), 5):
            assert np.array_equal(a[i]["tokens"].numpy(), b[i]["tokens"].numpy())


def test_memory_does_not_scale_with_the_corpus(tmp_path, monkeypatch):
    """200,000 samples: the reader maps the sources in place (the full unpack allocated
    24 bytes per sample, 4.8 MB, for layout windows), full verification and the split's
    sample list allocate one block of temporaries (old: tens of bytes per sample); the
    checksum reads through one fixed buffer, made 64 KiB here to fit the bound."""
    from megatron_endprompt.data.sidecar import sidecar_format

    monkeypatch.setattr(sidecar_format, "CHUNK", 1 << 16)
    n, tokens = 200_000, 2 * (200_000 + 1) * P
    open(tmp_path / "d.bin", "wb").truncate(2 * tokens)
    rng = np.random.default_rng(0)
    win = write_spans(str(tmp_path / "w.endprompt"), np.array([0, 0, n // 2, P * n]), "windows",
                      n, 2 * tokens)
    starts = rng.integers(0, tokens - P - 1, n)
    ptr = np.arange(0, 2 * n + 1, 2)
    pcs = np.stack([starts, np.full(n, P - 3), starts + P - 3, np.full(n, 4)], axis=1)
    pie = write_spans(str(tmp_path / "p.endprompt"), spans.join_sources(ptr, pcs.reshape(-1, 2)),
                      "pieces", n, 2 * tokens)
    del starts, ptr, pcs
    for sc in (win, pie):
        tracemalloc.start()
        reader = spans.span_reader(str(tmp_path / "d"), sc, np.uint16)
        for i in rng.integers(0, n, 100):
            assert len(reader.tokens(int(i))) == P + 1
        read_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        span_scan.verify_sources(sc, "rebuild", block=4096)
        verify_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        kept = span_scan.samples_within(sc, 0, tokens, block=4096)
        within_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert len(kept) == n
        assert read_peak < 64 << 10, (sc.header.sources["layout"], read_peak)
        assert verify_peak < 1 << 20, (sc.header.sources["layout"], verify_peak)
        assert within_peak < 4 * n + (1 << 19), (sc.header.sources["layout"], within_peak)


def _corrupt(kind):
    """(layout, sources of 7 samples, message) with the fault in a late block (samples 4-6)."""
    n, t = 7, 10 * P
    if kind.startswith("w-"):
        runs = np.array([[0, 0], [1, P], [2, 3 * P], [4, 2 * P], [5, 5 * P]])
        fault = {"w-first": lambda r: r.__setitem__((0, 0), 1),
                 "w-order": lambda r: r.__setitem__((4, 0), 4),
                 "w-past-n": lambda r: r.__setitem__((4, 0), 7),
                 "w-negative": lambda r: r.__setitem__((4, 1), -5),
                 "w-outside": lambda r: r.__setitem__((4, 1), 2 * t)}[kind]
        fault(runs)
        msg = "outside the .bin" if kind == "w-outside" else "window runs must start"
        return "windows", runs.ravel(), msg
    if kind == "odd":
        return "windows", np.array([0, 0, 1]), "pairs"
    ptr = np.arange(n + 1)
    pcs = np.stack([np.arange(n) * P, np.full(n, P + 1)], axis=1)
    if kind == "p-order":
        ptr = np.array([0, 1, 2, 3, 4, 6, 5, 7])
        pcs = np.stack([np.arange(n) * P, [P + 1] * 4 + [P, 1, P + 1]], axis=1)
        msg = "piece pointers"
    elif kind == "p-end":
        ptr = ptr.copy()
        ptr[-1] = 6
        msg = "piece pointers"
    elif kind == "p-sum":
        pcs[5, 1] = P
        msg = "P \\+ 1"
    elif kind == "p-outside":
        pcs[5, 0] = 2 * t
        msg = "outside the .bin"
    elif kind in ("p-eod", "p-prompt", "p-prompt-len"):
        pcs = np.concatenate([pcs[:5], [[0, P], [-1 if kind == "p-eod" else -5, 1]], pcs[6:]])
        ptr = np.array([0, 1, 2, 3, 4, 5, 7, 8])
        if kind == "p-eod":
            pcs[6, 1], pcs[5, 1] = 2, P - 1
        elif kind == "p-prompt-len":
            pcs[6] = (-4, 1)  # prompt 2 has 5 tokens
        msg = "EOD piece" if kind == "p-eod" else "prompt piece"
    return "pieces", spans.join_sources(ptr, pcs), msg


@pytest.mark.parametrize("kind", ["w-first", "w-order", "w-past-n", "w-negative", "w-outside",
                                  "odd", "p-order", "p-end", "p-sum", "p-outside", "p-eod",
                                  "p-prompt", "p-prompt-len"])
def test_chunked_verification_refuses_each_corruption(kind, tmp_path, small_blocks):
    """Verification in blocks of 3 samples (7 samples, the fault in the last blocks)."""
    layout, sources, msg = _corrupt(kind)
    sc = write_spans(str(tmp_path / "d.endprompt"), sources, layout, 7, 2 * 10 * P)
    with pytest.raises(UserError, match=f"impossible source spans .*{msg}"):
        verify_sidecar(sc)


def test_good_sources_pass_chunked_verification(tmp_path, small_blocks):
    n, t = 7, 10 * P
    for layout, sources in (("windows", np.array([0, 0, 2, 3 * P, 5, 5 * P])),
                            ("pieces", spans.join_sources(np.arange(n + 1), np.stack(
                                [np.arange(n) * P, np.full(n, P + 1)], axis=1)))):
        verify_sidecar(write_spans(str(tmp_path / f"{layout}.endprompt"), sources, layout, n,
                                   2 * t))


def test_tampered_idx_refused_for_spans_sidecar(corpus, run_tool, tmp_path):
    """Same size, different bytes, new mtime: the cached verdict no longer applies and the
    full verification refuses the spans sidecar (a cheap key must never trust changed bytes)."""
    import shutil

    prefix = str(tmp_path / "m")
    for ext in (".bin", ".idx"):
        shutil.copy(corpus + ext, prefix + ext)
    sc = _sidecar(run_tool, prefix, "tamper", "--placement", "random")
    cache = str(tmp_path / "cache")
    assert ensure_verified(sc, prefix, cache) == "verified"
    assert ensure_verified(open_sidecar(sc.path), prefix, cache) == "cached"
    _tamper_idx(prefix, keep_mtime=False)
    for _ in range(2):  # refused, and never cached as a pass
        with pytest.raises(UserError, match=r"does not match .*m\.idx \(fingerprint differs\)"):
            ensure_verified(open_sidecar(sc.path), prefix, cache)
