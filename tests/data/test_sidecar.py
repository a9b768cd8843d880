"""Sidecar round trip and corruption detection."""

from __future__ import annotations

import os
from dataclasses import asdict

import numpy as np
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from megatron_endprompt.data.sidecar import (
    SidecarHeader,
    file_fingerprint,
    read_sidecar,
    sidecar_path,
    write_sidecar,
)
from megatron_endprompt.errors import UserError
from megatron_endprompt.layout import LayoutConfig, make_record, sample_rng

P = 32


def _write_set(prefix: str, n: int = 20, pose: int = 2, seed: int = 0):
    layout = LayoutConfig(seq_length=P, target_length=256, placement="random", pose_chunks=pose)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    rng = np.random.default_rng(seed)
    for _ in range(n):
        builder.add_document(rng.integers(0, 500, P + 1), [P + 1])
    builder.finalize(prefix + ".idx")
    records = np.stack([make_record(layout, terminal_length=4, rng=sample_rng(seed, i)) for i in range(n)])
    header = SidecarHeader(layout=asdict(layout), terminal_source="continuation", terminal_length=4,
                           seed=seed, num_samples=n, idx_sha256=file_fingerprint(prefix + ".idx"),
                           bin_bytes=os.path.getsize(prefix + ".bin"))
    write_sidecar(sidecar_path(prefix), header, records)
    return records


def test_round_trip(tmp_path):
    prefix = str(tmp_path / "d")
    records = _write_set(prefix)
    sc = read_sidecar(sidecar_path(prefix), prefix=prefix)
    assert np.array_equal(sc.records, records)
    assert sc.layout.pose_chunks == 2 and sc.header.num_samples == 20
    # compact: 4 int32 per sample plus a small header
    assert os.path.getsize(sc.path) < 20 * 16 + 1024


def _expect(path, prefix, *needles):
    with pytest.raises(UserError) as info:
        read_sidecar(path, prefix=prefix)
    msg = str(info.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def test_missing(tmp_path):
    _expect(str(tmp_path / "x.endprompt"), None, "x.endprompt", "not found", "preprocess_endprompt")


@pytest.mark.parametrize("cut", [3, 20, -1, -13])
def test_truncated(tmp_path, cut):
    prefix = str(tmp_path / "d")
    _write_set(prefix)
    path = sidecar_path(prefix)
    blob = open(path, "rb").read()
    open(path, "wb").write(blob[:cut] if cut > 0 else blob[:cut])
    msg = _expect(path, prefix, path)
    assert "truncated" in msg or "corrupt" in msg


def test_bad_magic_and_version(tmp_path):
    prefix = str(tmp_path / "d")
    _write_set(prefix)
    path = sidecar_path(prefix)
    blob = bytearray(open(path, "rb").read())
    open(path, "wb").write(b"XXXXXXXX" + blob[8:])
    _expect(path, prefix, "bad magic")
    blob[8] = 99
    open(path, "wb").write(blob)
    _expect(path, prefix, "version 99")


def test_flipped_record_byte_fails_checksum(tmp_path):
    prefix = str(tmp_path / "d")
    _write_set(prefix)
    path = sidecar_path(prefix)
    blob = bytearray(open(path, "rb").read())
    blob[-3] ^= 0xFF
    open(path, "wb").write(blob)
    _expect(path, prefix, "checksum")


def test_stale_data_is_refused_naming_both_files(tmp_path):
    prefix = str(tmp_path / "d")
    _write_set(prefix)
    path = sidecar_path(prefix)
    # rewrite the data with the same size but other content: the .idx fingerprint still
    # matches (same lengths) -> rewrite with a different number of samples instead
    keep = open(path, "rb").read()
    _write_set(prefix, n=21, seed=1)
    open(path, "wb").write(keep)
    _expect(path, prefix, path, prefix + ".bin")
    # same .bin size but a different .idx
    _write_set(prefix, n=20, seed=1)
    open(path, "wb").write(keep)
    with open(prefix + ".idx", "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    _expect(path, prefix, path, prefix + ".idx", "fingerprint")
    os.unlink(prefix + ".bin")
    _expect(path, prefix, prefix + ".bin", "missing")
