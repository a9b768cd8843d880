"""Sidecar round trip, whole-header checksum, value validation and corruption detection."""

from __future__ import annotations

import json
import os
import struct
import zlib

import numpy as np
import pytest
from tests.support.sidecar_edit import rewrite_header
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from megatron_endprompt.data.sidecar import sidecar_format
from megatron_endprompt.data.sidecar.sidecar import (
    SidecarHeader,
    data_fingerprint,
    open_sidecar,
    read_sidecar,
    sidecar_path,
    verify_sidecar,
    write_sidecar,
)
from megatron_endprompt.errors import UserError
from megatron_endprompt.layout import LayoutConfig, make_record, sample_rng
from megatron_endprompt.loss_weights import LossWeights

P, L = 32, 256
TOKENIZER = {"tokenizer_type": "NullTokenizer", "tokenizer_model": None, "vocab_size": 501,
             "eod": 500, "fingerprint": "ab" * 32}


def _write_set(prefix: str, n: int = 20, pose: int = 2, seed: int = 0, name=None):
    layout = LayoutConfig(seq_length=P, target_length=L, placement="random", pose_chunks=pose,
                          loss_weights=LossWeights(terminal=0.5, context=1.0))
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    rng = np.random.default_rng(seed)
    for _ in range(n):
        builder.add_document(rng.integers(0, 500, P + 1), [P + 1])
    builder.finalize(prefix + ".idx")
    records = np.stack([make_record(layout, terminal_length=4, rng=sample_rng(seed, i))
                        for i in range(n)])
    header = SidecarHeader(layout=layout.to_header(), terminal_source="continuation",
                           terminal_length=4, seed=seed, num_samples=n, tokenizer=dict(TOKENIZER),
                           **data_fingerprint(prefix))
    write_sidecar(sidecar_path(prefix, name), header, records)
    return records


def test_round_trip(good):
    sc = read_sidecar(sidecar_path(good), prefix=good)
    assert isinstance(sc.records, np.memmap), "records are memory-mapped, never copied"
    assert sc.layout.pose_chunks == 2 and sc.header.num_samples == 20
    assert sc.header.tokenizer == TOKENIZER
    # compact: 4 int32 per sample plus a small header
    assert os.path.getsize(sc.path) < 20 * 16 + 1024


def test_chunked_crc_equals_whole_crc(tmp_path, monkeypatch):
    monkeypatch.setattr(sidecar_format, "CHUNK", 64)  # 4 records per chunk
    prefix = str(tmp_path / "d")
    records = _write_set(prefix, n=23)
    sc = read_sidecar(sidecar_path(prefix), prefix=prefix)
    assert sc.header.records_crc32 == zlib.crc32(records.astype("<i4").tobytes())


def test_named_sidecar_path(tmp_path):
    prefix = str(tmp_path / "d")
    assert sidecar_path(prefix) == prefix + ".endprompt"
    assert sidecar_path(prefix, "L64K_fixed") == prefix + ".L64K_fixed.endprompt"
    _write_set(prefix, name="L64K_fixed")
    assert read_sidecar(sidecar_path(prefix, "L64K_fixed"), prefix=prefix).header.num_samples == 20
    for bad in ("", "a/b", ".x", "x.", "a b", "../up"):
        with pytest.raises(UserError, match="--name"):
            sidecar_path(prefix, bad)


def _expect(path, prefix, *needles, verify=True):
    with pytest.raises(UserError) as info:
        read_sidecar(path, prefix=prefix, verify=verify)
    msg = str(info.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def test_missing(tmp_path):
    _expect(str(tmp_path / "x.endprompt"), None, "x.endprompt", "not found", "preprocess_endprompt")


@pytest.mark.parametrize("cut", [3, 14, 20, 40, -1, -13])
def test_truncated(good, cut):
    path = sidecar_path(good)
    blob = open(path, "rb").read()
    open(path, "wb").write(blob[:cut])
    msg = _expect(path, good, path)
    assert "truncated" in msg or "corrupt" in msg or "checksum" in msg


def test_bad_magic_and_old_version(good):
    path = sidecar_path(good)
    blob = bytearray(open(path, "rb").read())
    open(path, "wb").write(b"XXXXXXXX" + blob[8:])
    _expect(path, good, "bad magic")
    blob[8] = 99
    open(path, "wb").write(blob)
    _expect(path, good, "version 99")
    # a version-1 sidecar (no header checksum, no tokenizer identity): one line, rebuild
    v1 = struct.pack("<8sII", b"EPSIDECR", 1, 2) + b"{}" + b"\0" * 6
    open(path, "wb").write(v1)
    msg = _expect(path, good, "sidecar version 1", "reads version 2", "re-run")
    assert "build_endprompt_sidecar" in msg


def _header_span(path):
    blob = open(path, "rb").read()
    hlen = struct.unpack("<I", blob[12:16])[0]
    return blob, 20, 20 + hlen


HEADER_FIELDS = ["layout", "seq_length", "target_length", "placement", "pose_chunks",
                 "terminal_loss_weight", "context_loss_weight", "terminal_source",
                 "terminal_length", "seed", "num_samples", "idx_sha256", "idx_bytes",
                 "bin_bytes", "records_crc32", "tokenizer", "vocab_size", "eod", "fingerprint"]


@pytest.mark.parametrize("field", HEADER_FIELDS)
def test_flipped_bit_in_each_header_field_is_refused(good, field):
    """One flipped bit turned w=1.0 into 9.0 and training accepted it: every field is checked."""
    path = sidecar_path(good)
    blob, start, end = _header_span(path)
    key = f'"{field}": '.encode()
    at = blob.index(key, start, end) + len(key)  # first byte of the value
    damaged = bytearray(blob)
    damaged[at] ^= 1 << 2
    open(path, "wb").write(bytes(damaged))
    for verify in (False, True):  # the cheap check every rank makes already refuses it
        _expect(path, good, path, verify=verify)


@pytest.mark.parametrize("offset", [8, 12, 16, 19, -1])
def test_flipped_bit_in_fixed_fields_or_padding_is_refused(good, offset):
    path = sidecar_path(good)
    blob, start, end = _header_span(path)
    damaged = bytearray(blob)
    at = offset if offset >= 0 else end  # -1: first padding byte (or first record byte)
    damaged[at] ^= 0x04
    open(path, "wb").write(bytes(damaged))
    _expect(path, good, path)


def _set(*keys_value):
    *keys, value = keys_value

    def mutate(values):
        d = values
        for k in keys[:-1]:
            d = d[k]
        if value is KeyError:
            del d[keys[-1]]
        else:
            d[keys[-1]] = value
    return mutate


BAD_VALUES = {
    "w_inf": (_set("layout", "terminal_loss_weight", 1e309), "terminal_loss_weight"),
    "w_zero": (_set("layout", "terminal_loss_weight", 0.0), "terminal_loss_weight"),
    "cw_negative": (_set("layout", "context_loss_weight", -1.0), "context_loss_weight"),
    "L_not_above_P": (_set("layout", "target_length", P), "target_length"),
    "L_overflow": (_set("layout", "target_length", 2**31), "target_length"),
    "L_float": (_set("layout", "target_length", 256.5), "target_length"),
    "P_bool": (_set("layout", "seq_length", True), "seq_length"),
    "placement": (_set("layout", "placement", "middle"), "placement"),
    "pose_zero": (_set("layout", "pose_chunks", 0), "pose_chunks"),
    "layout_extra_key": (_set("layout", "extra", 1), "layout"),
    "b_too_long": (_set("terminal_length", P), "terminal_length"),
    "b_null": (_set("terminal_length", None), "terminal_length"),
    "source": (_set("terminal_source", "tail"), "terminal_source"),
    "seed_negative": (_set("seed", -1), "seed"),
    "num_samples_negative": (_set("num_samples", -1), "num_samples"),
    "sha_short": (_set("idx_sha256", "abc"), "idx_sha256"),
    "idx_bytes_small": (_set("idx_bytes", 10), "idx_bytes"),
    "crc_range": (_set("records_crc32", 2**32), "records_crc32"),
    "vocab_zero": (_set("tokenizer", "vocab_size", 0), "vocab_size"),
    "eod_outside_vocab": (_set("tokenizer", "eod", 501), "tokenizer.eod"),
    "fingerprint": (_set("tokenizer", "fingerprint", "xyz"), "fingerprint"),
    "unknown_field": (_set("surprise", 1), "surprise"),
    "missing_layout": (_set("layout", KeyError), "layout"),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_invalid_header_value_with_valid_checksum_is_refused(good, case):
    mutate, needle = BAD_VALUES[case]
    path = sidecar_path(good)
    rewrite_header(path, mutate)
    msg = _expect(path, good, path, "invalid sidecar header", needle, verify=False)
    assert "re-run" in msg


def test_rewrite_helper_keeps_a_valid_file(good):
    rewrite_header(sidecar_path(good), lambda v: None)
    read_sidecar(sidecar_path(good), prefix=good)


def test_flipped_record_byte_fails_checksum(good):
    path = sidecar_path(good)
    blob = bytearray(open(path, "rb").read())
    blob[-3] ^= 0xFF
    open(path, "wb").write(blob)
    open_sidecar(path)  # cheap open does not read records
    _expect(path, good, "checksum")


def test_impossible_record_with_valid_checksum_is_refused(good):
    """Consistency: a record make_record cannot produce (T beyond L - b) fails verification."""
    sc = open_sidecar(sidecar_path(good))
    records = np.array(sc.records)
    records[7, 1] = L  # terminal start at L: positions beyond the window
    header = sc.header
    write_sidecar(sc.path, header, records)
    with pytest.raises(UserError, match=r"sample 7 has an impossible layout \(terminal start"):
        verify_sidecar(open_sidecar(sc.path), good)


def test_stale_data_is_refused_naming_both_files(good):
    prefix = good
    path = sidecar_path(prefix)
    keep = open(path, "rb").read()
    _write_set(prefix, n=21, seed=1)
    open(path, "wb").write(keep)
    _expect(path, prefix, path, prefix + ".bin", verify=False)  # sizes: the cheap check
    # same sizes but a different .idx: only the full check sees it
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


def test_preprocess_and_inspect_named_sidecar(spm_args, run_tool, tmp_path):
    """--name writes PREFIX.NAME.endprompt (the default name is left alone)."""
    from megatron_endprompt.cli import inspect as inspect_cli
    from megatron_endprompt.cli import preprocess as preprocess_cli

    prefix = str(tmp_path / "n")
    rc, out, err = run_tool(preprocess_cli.main, spm_args(prefix, "--name", "L512"))
    assert rc == 0, err
    assert os.path.exists(prefix + ".L512.endprompt") and not os.path.exists(prefix + ".endprompt")
    assert prefix + ".L512.endprompt" in out
    rc, out, err = run_tool(inspect_cli.main, [prefix, "--name", "L512", "--json"])
    assert rc == 0, err
    assert json.loads(out)["stats"]["layout"]["target_length"] == 512
    rc, out, err = run_tool(preprocess_cli.main, spm_args(str(tmp_path / "m"), "--name", "a/b"))
    assert rc != 0 and err.count("error:") == 1 and "--name" in err
    assert not [f for f in os.listdir(tmp_path) if f.startswith("m.")]


def test_unknown_tokenizer_is_accepted_with_a_warning_known_one_is_checked(good, caplog):
    """A sidecar for an existing corpus may record no tokenizer: trained with a warning."""
    from megatron_endprompt.data.dataset import check_tokenizer
    from megatron_endprompt.data.tokenize.tokenizer_identity import TokenizerIdentity

    current = TokenizerIdentity(vocab_size=501, eod=500, fingerprint="cd" * 32)
    with pytest.raises(UserError, match="made with tokenizer NullTokenizer"):
        check_tokenizer(read_sidecar(sidecar_path(good)), current)
    rewrite_header(sidecar_path(good), _set("tokenizer", {}))
    check_tokenizer(read_sidecar(sidecar_path(good)), current)
    assert "records no tokenizer identity" in caplog.text
