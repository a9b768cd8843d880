"""Per-block CRC-32 of the ``.bin`` (data/sidecar/bin_checksum.py): recorded at write time, all
blocks checked at first use, a sample at later starts; old sidecars stay readable."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from megatron_endprompt.data.sidecar.bin_checksum import bin_block_crcs, verify_bin
from megatron_endprompt.errors import UserError


def _bin(tmp_path, n=10_000):
    path = tmp_path / "d.bin"
    path.write_bytes(os.urandom(n))
    return str(path)


def _sidecar(rec):
    return SimpleNamespace(path="d.endprompt", header=SimpleNamespace(bin_crc32=rec))


def _flip(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)[0]
        f.seek(at)
        f.write(bytes([b ^ 1]))


def test_every_block_checked_and_a_flip_named_by_its_range(tmp_path):
    path = _bin(tmp_path)
    rec = bin_block_crcs(path, block_bytes=1024)
    assert len(rec["crcs"]) == 10  # 9 full blocks and a short last one
    assert verify_bin(_sidecar(rec), path) == 10
    _flip(path, 9_500)
    with pytest.raises(UserError, match=r"bytes 9,216\.\.10,000 fail the CRC-32"):
        verify_bin(_sidecar(rec), path)


def test_sample_checks_only_that_many_blocks(tmp_path):
    path = _bin(tmp_path)
    rec = bin_block_crcs(path, block_bytes=1024)
    _flip(path, 5)  # block 0: found by a sample only when drawn
    seen = set()
    for _ in range(60):
        try:
            assert verify_bin(_sidecar(rec), path, sample=2) == 2
            seen.add("missed")
        except UserError:
            seen.add("caught")
    assert seen == {"missed", "caught"}  # what the README says is not verified


def test_sidecar_without_checksums_checks_nothing(tmp_path):
    assert verify_bin(_sidecar({}), _bin(tmp_path)) == 0


def test_checksums_of_another_size_are_refused(tmp_path):
    rec = bin_block_crcs(_bin(tmp_path, 5_000), block_bytes=1024)
    with pytest.raises(UserError, match="bin_crc32"):
        verify_bin(_sidecar(rec), _bin(tmp_path, 10_000))


def test_preprocessing_records_them(tmp_path):
    import json

    from megatron_endprompt.data.prepare.preprocess import PreprocessOptions, preprocess
    from megatron_endprompt.data.sidecar.sidecar import read_sidecar
    from megatron_endprompt.data.sidecar.terminal_spec import TerminalSpec
    from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec
    from megatron_endprompt.layout import LayoutConfig

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": " ".join(str(i % 97) for i in range(90))})
                              + "\n" for _ in range(20)))
    prefix = str(tmp_path / "ep")
    preprocess(PreprocessOptions(
        inputs=[str(corpus)], output_prefix=prefix,
        tokenizer=TokenizerSpec(tokenizer_type="NullTokenizer", vocab_size=1000),
        append_eod=True, progress=False, layout=LayoutConfig(seq_length=32, target_length=256),
        terminal=TerminalSpec(source="continuation", length=8, seed=1)))
    rec = read_sidecar(prefix + ".endprompt").header.bin_crc32
    assert rec == bin_block_crcs(prefix + ".bin")


def test_ranges_check_only_the_blocks_they_touch(tmp_path):
    from megatron_endprompt.data.sidecar.bin_checksum import verify_bin_ranges

    path = _bin(tmp_path)
    rec = bin_block_crcs(path, block_bytes=1024)
    assert verify_bin_ranges(_sidecar(rec), path, [(1000, 1030), (5000, 5001)]) == (3, 10)
    assert verify_bin_ranges(_sidecar({}), path, [(0, 10)]) == (0, 0)
    _flip(path, 9_500)
    assert verify_bin_ranges(_sidecar(rec), path, [(0, 9_216)]) == (9, 10)  # not block 9
    with pytest.raises(UserError, match=r"bytes 9,216\.\.10,000 fail the CRC-32"):
        verify_bin_ranges(_sidecar(rec), path, [(9_000, 9_300)])
