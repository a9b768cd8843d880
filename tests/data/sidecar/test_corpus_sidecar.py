"""Corpus sidecars (over an existing Megatron corpus) on sidecar v2 (merge of ``corpus`` into main):
the ``sources`` spans are covered by the whole-header CRC, validated on read and checked by the full
verification the trust cache runs; the tokenizer identity is recorded only when a tokenizer is
given; the standalone build holds the prefix lock; ``document-tail`` keeps main's same-document
semantics (short documents give contiguous records, which verification accepts)."""

from __future__ import annotations

import json
import logging
import os
import zlib

import numpy as np
import pytest
from tests.support.sidecar_edit import rewrite_header
from test_build_sidecar import VOCAB, write_corpus

from megatron_endprompt.cli import build_sidecar as cli
from megatron_endprompt.data.prepare.atomic_output import prefix_lock
from megatron_endprompt.data.dataset import find_sidecar
from megatron_endprompt.data.sidecar.sidecar import open_sidecar, read_sidecar, verify_sidecar
from megatron_endprompt.data.sidecar.spans import span_reader
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer
from megatron_endprompt.data.tokenize.tokenizer_identity import tokenizer_identity
from megatron_endprompt.data.sidecar.trust import ensure_verified
from megatron_endprompt.errors import UserError

P, L, B = 32, 256, 8


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("corpus_v2") / "megatron")
    write_corpus(prefix, n_docs=60, seed=1)
    return prefix


def _build(run_tool, prefix, name, *extra):
    rc, out, err = run_tool(cli.main, ["--data-prefix", prefix, "--seq-length", P,
                                       "--target-length", L, "--terminal-length", B,
                                       "--no-progress", "--name", name, "--summary-json", *extra])
    assert rc == 0, err
    return f"{prefix}.{name}.endprompt", json.loads(out[out.index("{"):])


def test_document_tail_short_documents_are_contiguous_and_verify(corpus, run_tool):
    """Fixed placement: a long document gives context + its own tail at L - b; documents
    shorter than one sample are packed into contiguous windows (T = a), which full
    verification accepts (it refused them before the merge fix)."""
    path, summary = _build(run_tool, corpus, "tail", "--terminal-source", "document-tail")
    sc = read_sidecar(path, prefix=corpus)  # full verification
    records = np.asarray(sc.records)
    contiguous = records[:, 1] == records[:, 0]
    assert summary["samples_contiguous_positions"] == int(contiguous.sum()) > 0
    assert np.all(records[~contiguous, 1] == L - B)


def test_tokenizer_identity_recorded_only_with_a_tokenizer(corpus, run_tool, caplog):
    plain, _ = _build(run_tool, corpus, "notok")
    assert open_sidecar(plain).header.tokenizer == {}
    tok = build_tokenizer(TokenizerSpec(tokenizer_type="NullTokenizer", vocab_size=VOCAB))
    current = tokenizer_identity(tok, tokenizer_type="NullTokenizer")
    with caplog.at_level(logging.WARNING):
        find_sidecar(corpus, seq_length=P, target_length=L, name="notok",
                     tokenizer_identity=current)
    assert "records no tokenizer identity" in caplog.text
    named, _ = _build(run_tool, corpus, "tok", "--tokenizer-type", "NullTokenizer",
                      "--vocab-size", VOCAB)
    recorded = open_sidecar(named).header.tokenizer
    assert recorded["vocab_size"] == VOCAB and recorded["fingerprint"] == current.fingerprint
    find_sidecar(corpus, seq_length=P, target_length=L, name="tok", tokenizer_identity=current)
    other = tokenizer_identity(build_tokenizer(TokenizerSpec(tokenizer_type="NullTokenizer",
                                                             vocab_size=VOCAB + 1)))
    with pytest.raises(UserError, match="made with tokenizer"):
        find_sidecar(corpus, seq_length=P, target_length=L, name="tok", tokenizer_identity=other)


def test_sources_covered_by_header_crc_and_full_verification(corpus, run_tool, tmp_path):
    path, _ = _build(run_tool, corpus, "crc", "--placement", "random")
    sc = open_sidecar(path)
    assert sc.sources is not None and sc.header.sources["kind"] == "spans"
    span_start = os.path.getsize(path) - 8 * len(sc.sources)
    good = open(path, "rb").read()
    # a flipped bit in the spans: the cheap open passes, full verification (trust cache) fails
    bad = bytearray(good)
    bad[span_start] ^= 1
    open(path, "wb").write(bytes(bad))
    with pytest.raises(UserError, match="source spans fail their checksum"):
        verify_sidecar(open_sidecar(path))
    with pytest.raises(UserError, match="source spans fail their checksum"):
        ensure_verified(open_sidecar(path), corpus, str(tmp_path / "cache"))
    assert not os.listdir(tmp_path / "cache") if (tmp_path / "cache").exists() else True
    # the spans' length/CRC live in the header: editing them breaks the header checksum
    bad = bytearray(good)
    i = good.index(b'"length": ')
    bad[i + 10] = ord("9") if bad[i + 10] != ord("9") else ord("8")
    open(path, "wb").write(bytes(bad))
    with pytest.raises(UserError, match="header fails its checksum"):
        open_sidecar(path)
    # a header with a valid CRC but impossible sources values is refused by value
    open(path, "wb").write(good)
    rewrite_header(path, lambda h: h["sources"].update(kind="copies"))
    with pytest.raises(UserError, match="invalid sidecar header: sources.kind"):
        open_sidecar(path)
    # spans pointing past the .bin (valid CRCs): refused by the full verification
    open(path, "wb").write(good)
    spans = np.fromfile(path, dtype="<i8", offset=span_start)
    spans[1::2] += 10**9 if sc.header.sources["layout"] == "windows" else 0
    if sc.header.sources["layout"] == "pieces":
        n = sc.header.num_samples
        spans[n + 1 :: 2] += 10**9
    with open(path, "r+b") as f:
        f.seek(span_start)
        f.write(spans.astype("<i8").tobytes())
    rewrite_header(path, lambda h: h["sources"].update(crc32=zlib.crc32(spans.astype("<i8"))))
    with pytest.raises(UserError, match="outside the .bin"):
        verify_sidecar(open_sidecar(path))
    open(path, "wb").write(good)
    verify_sidecar(open_sidecar(path))


def test_standalone_build_holds_the_prefix_lock(corpus, run_tool):
    stale = f"{corpus}.locked.endprompt.tmp-999999999"  # a killed build's temporary
    open(stale, "wb").write(b"partial")
    with prefix_lock(corpus):
        rc, _, err = run_tool(cli.main, ["--data-prefix", corpus, "--seq-length", P,
                                         "--target-length", L, "--terminal-length", B,
                                         "--no-progress", "--name", "locked"])
    assert rc == 2 and err.count("\n") == 1 and "another run" in err
    assert not os.path.exists(f"{corpus}.locked.endprompt") and os.path.exists(stale)
    _build(run_tool, corpus, "locked")
    assert not [f for f in os.listdir(os.path.dirname(corpus)) if ".tmp-" in f]


def test_composed_samples_equal_reader_through_open(corpus, run_tool):
    path, _ = _build(run_tool, corpus, "read", "--pose-chunks", 2, "--placement", "random")
    sc = open_sidecar(path)
    reader = span_reader(corpus, sc, np.uint16)
    assert all(len(reader.tokens(i)) == P + 1 for i in range(sc.header.num_samples))
