"""Missing, stale, truncated or corrupt sidecars (and missing data files) refused by inspect and
by ``read_sidecar`` with one line naming both files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from megatron_endprompt.cli import inspect as inspect_cli
from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
from megatron_endprompt.errors import UserError

# tests/data is on sys.path under pytest (rootdir-relative test modules)
from tests.support.bad_input import _assert_one_error_line, _copy_good, _jsonl


# -- inspect: missing / stale / truncated sidecars -----------------------------------------
@pytest.fixture(scope="module")
def other_output(spm_args, spm_corpus, tmp_path_factory):
    """Preprocessing of different data (the first 15 documents) with the same flags."""
    from megatron_endprompt.errors import run_cli

    d = tmp_path_factory.mktemp("other")
    lines = Path(spm_corpus.path).read_text(encoding="utf-8").splitlines()
    path = _jsonl(d / "other.jsonl", lines[:15])
    prefix = str(d / "other")
    assert run_cli(preprocess_cli.main, spm_args(prefix, inputs=[path])) == 0
    return prefix


def _damage_missing(prefix, other):
    os.unlink(prefix + ".endprompt")
    return [prefix + ".endprompt", "not found"]


def _damage_truncated_records(prefix, other):
    data = Path(prefix + ".endprompt").read_bytes()
    Path(prefix + ".endprompt").write_bytes(data[:-3])
    return [prefix + ".endprompt", "truncated"]


def _damage_truncated_header(prefix, other):
    data = Path(prefix + ".endprompt").read_bytes()
    Path(prefix + ".endprompt").write_bytes(data[:10])
    return [prefix + ".endprompt", "truncated"]


def _damage_truncated_json(prefix, other):
    data = Path(prefix + ".endprompt").read_bytes()
    Path(prefix + ".endprompt").write_bytes(data[:40])
    return [prefix + ".endprompt"]


def _damage_bad_magic(prefix, other):
    data = bytearray(Path(prefix + ".endprompt").read_bytes())
    data[:8] = b"NOTMAGIC"
    Path(prefix + ".endprompt").write_bytes(bytes(data))
    return [prefix + ".endprompt", "not an EndPrompt sidecar"]


def _damage_flipped_record(prefix, other):
    data = bytearray(Path(prefix + ".endprompt").read_bytes())
    data[-2] ^= 0x01
    Path(prefix + ".endprompt").write_bytes(bytes(data))
    return [prefix + ".endprompt", "checksum"]


def _damage_stale_bin(prefix, other):
    """The .bin rewritten by a later run on different data; .idx and sidecar are old."""
    shutil.copyfile(other + ".bin", prefix + ".bin")
    return [prefix + ".endprompt", prefix + ".bin"]


def _damage_stale_bin_and_idx(prefix, other):
    shutil.copyfile(other + ".bin", prefix + ".bin")
    shutil.copyfile(other + ".idx", prefix + ".idx")
    return [prefix + ".endprompt", prefix + ".bin"]


def _damage_stale_sidecar(prefix, other):
    """A sidecar from another run copied next to this data."""
    shutil.copyfile(other + ".endprompt", prefix + ".endprompt")
    return [prefix + ".endprompt", prefix + ".bin"]


def _damage_modified_idx(prefix, other):
    with open(prefix + ".idx", "ab") as f:
        f.write(b"\0")
    return [prefix + ".endprompt", prefix + ".idx"]


DAMAGES = {n[len("_damage_"):]: f for n, f in globals().items() if n.startswith("_damage_")}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_inspect_refuses_bad_sidecar(damage, run_tool, good_output, other_output, tmp_path):
    prefix = _copy_good(good_output, tmp_path)
    needles = DAMAGES[damage](prefix, other_output)
    before = sorted(os.listdir(tmp_path))
    rc, out, err = run_tool(inspect_cli.main, [prefix, "--json"])
    line = _assert_one_error_line(rc, err, *needles)
    assert out == ""
    with pytest.raises(UserError) as exc:
        read_sidecar(sidecar_path(prefix), prefix=prefix)
    assert f"error: {exc.value}" == line  # the library refuses with the same message
    assert sorted(os.listdir(tmp_path)) == before  # inspect writes nothing


@pytest.mark.parametrize("missing", [".bin", ".idx"])
def test_inspect_missing_data_file(missing, run_tool, good_output, tmp_path):
    prefix = _copy_good(good_output, tmp_path)
    os.unlink(prefix + missing)
    rc, out, err = run_tool(inspect_cli.main, [prefix])
    _assert_one_error_line(rc, err, prefix + missing, "--output-prefix")
    with pytest.raises(UserError, match="missing"):
        read_sidecar(sidecar_path(prefix), prefix=prefix)


@pytest.mark.parametrize("index", [-1, 10**6])
def test_inspect_index_out_of_range(index, run_tool, good_output):
    n = read_sidecar(sidecar_path(good_output)).header.num_samples
    rc, out, err = run_tool(inspect_cli.main, [good_output, "--index", index])
    _assert_one_error_line(rc, err, "--index", f"{n} samples")


def test_sidecar_without_prefix_check_still_reads(good_output, other_output, tmp_path):
    """Sanity for the stale cases above: the damaged-by-copy sidecar itself is intact; only
    its pairing with the data is refused."""
    prefix = _copy_good(good_output, tmp_path)
    shutil.copyfile(other_output + ".bin", prefix + ".bin")
    sc = read_sidecar(sidecar_path(prefix))
    assert sc.header.num_samples == len(np.asarray(sc.records)) > 0
