"""Verify once, then trust a cheap key (every rank re-verifying the corpus was the start-up
cost): full verification once per file identity, cached atomically in the data cache directory;
a tampered ``.idx`` is still refused."""

from __future__ import annotations

import os
import time

import pytest

from megatron_endprompt.data.sidecar import sidecar as sc_mod
from megatron_endprompt.data.sidecar import sidecar_format
from megatron_endprompt.data.sidecar import trust
from megatron_endprompt.data.sidecar.sidecar import open_sidecar, sidecar_path
from megatron_endprompt.errors import UserError


def _no_full_reads(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("full verification ran on a cache hit")
    monkeypatch.setattr(trust, "verify_sidecar", boom)
    monkeypatch.setattr(trust, "file_fingerprint", boom)


def test_verified_once_then_cached(good, tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    sc = open_sidecar(sidecar_path(good))
    assert trust.ensure_verified(sc, good, cache) == "verified"
    assert [f for f in os.listdir(cache) if f.startswith("endprompt-verified-sidecar-")]
    _no_full_reads(monkeypatch)
    assert trust.ensure_verified(open_sidecar(sidecar_path(good)), good, cache) == "cached"


def test_miss_without_build_is_deferred(good, tmp_path):
    sc = open_sidecar(sidecar_path(good))
    assert trust.ensure_verified(sc, good, str(tmp_path / "c"), build=False) == "deferred"
    assert not os.path.exists(tmp_path / "c")


def _tamper_idx(prefix, *, keep_mtime: bool):
    st = os.stat(prefix + ".idx")
    data = bytearray(open(prefix + ".idx", "rb").read())
    data[-1] ^= 0x01  # same size, different bytes
    time.sleep(0.01)
    with open(prefix + ".idx", "r+b") as f:
        f.write(data)
    if keep_mtime:
        os.utime(prefix + ".idx", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.path.getsize(prefix + ".idx") == st.st_size


@pytest.mark.parametrize("keep_mtime", [False, True])
def test_tampered_idx_is_still_refused(good, tmp_path, keep_mtime):
    """Same size, different bytes, new mtime (or the old mtime put back: ctime still moves)."""
    cache = str(tmp_path / "cache")
    assert trust.ensure_verified(open_sidecar(sidecar_path(good)), good, cache) == "verified"
    _tamper_idx(good, keep_mtime=keep_mtime)
    for _ in range(2):  # refused, and the refusal is never cached as a pass
        with pytest.raises(UserError, match=r"does not match .*d\.idx \(fingerprint differs\)"):
            trust.ensure_verified(open_sidecar(sidecar_path(good)), good, cache)


def test_rewritten_sidecar_is_reverified(good, tmp_path):
    cache = str(tmp_path / "cache")
    trust.ensure_verified(open_sidecar(sidecar_path(good)), good, cache)
    path = sidecar_path(good)
    blob = bytearray(open(path, "rb").read())
    blob[-2] ^= 0x10
    open(path, "wb").write(bytes(blob))
    with pytest.raises(UserError, match="checksum"):
        trust.ensure_verified(open_sidecar(path), good, cache)


def test_unwritable_cache_still_verifies(good, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    sc = open_sidecar(sidecar_path(good))
    assert trust.ensure_verified(sc, good, str(blocker / "cache")) == "verified"
    assert "cannot cache the verification" in caplog.text


def test_idx_fingerprint_cached_and_follows_content(good, tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    first = trust.idx_fingerprint(good, cache)
    assert first == sc_mod.file_fingerprint(good + ".idx")
    calls = []
    real = trust.file_fingerprint
    monkeypatch.setattr(trust, "file_fingerprint", lambda p: calls.append(p) or real(p))
    assert trust.idx_fingerprint(good, cache) == first and calls == []
    _tamper_idx(good, keep_mtime=True)
    assert trust.idx_fingerprint(good, cache) != first and len(calls) == 1


def test_full_verification_memory_is_one_chunk(tmp_path, monkeypatch):
    """Records are never copied whole: verifying 4 MB of records with 64 KB chunks allocates
    about one chunk (the old code copied the whole table with ``records.tobytes()``)."""
    import tracemalloc

    import numpy as np

    from megatron_endprompt.data.sidecar.sidecar import SidecarHeader, write_sidecar
    from megatron_endprompt.layout import LayoutConfig

    n, P, L, b = 500_000, 32, 256, 4
    layout = LayoutConfig(seq_length=P, target_length=L)
    records = np.tile(np.array([P - b, L - b], dtype=np.int32), (n, 1))
    path = str(tmp_path / "big.endprompt")
    header = SidecarHeader(layout=layout.to_header(), terminal_source="continuation",
                           terminal_length=b, num_samples=n, idx_sha256="0" * 64,
                           idx_bytes=34 + 20 * n, bin_bytes=n * (P + 1) * 2)
    write_sidecar(path, header, records)
    del records
    monkeypatch.setattr(sidecar_format, "CHUNK", 64 << 10)
    sc = open_sidecar(path)
    tracemalloc.start()
    sc_mod.verify_sidecar(sc)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, f"peak {peak} bytes for {4 * 2 * n} bytes of records"


@pytest.mark.process
def test_rank0_verifies_others_hit_the_cache(tmp_path):
    """Two gloo ranks build the datasets: rank 0 of the data group verifies once (before
    Megatron's builder barrier), rank 1 finds the verdict cached and reads nothing in full."""
    import json

    from tests.support.torchrun import run_torchrun
    from test_dataset import SPEC, _corpus
    from megatron_endprompt.data.prepare.preprocess import PreprocessOptions, preprocess
    from megatron_endprompt.data.sidecar.terminal_spec import TerminalSpec
    from megatron_endprompt.layout import LayoutConfig

    prefix = str(tmp_path / "ep")
    preprocess(PreprocessOptions(
        inputs=[_corpus(tmp_path / "c.jsonl", n_docs=60)], output_prefix=prefix, tokenizer=SPEC,
        append_eod=True, progress=False,
        terminal=TerminalSpec(source="continuation", length=8, seed=7),
        layout=LayoutConfig(seq_length=32, target_length=256, placement="random")))
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trust_worker.py")
    proc = run_torchrun(worker, "--prefix", prefix, "--cache", tmp_path / "cache",
                        "--out", tmp_path, nproc=2)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["calls"] == ["verify"], ranks[0]
    assert ranks[1]["calls"] == [], ranks[1]
    assert ranks[0]["first_sample"] == ranks[1]["first_sample"]
