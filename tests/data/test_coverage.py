"""Start-up messages about the data layout: coverage (share of samples with a position jump and
of tokens used) from the sidecar's recorded stats; a mistyped sidecar name lists the sidecars
that exist; a wrong ``L`` says only the sidecar needs rebuilding."""

from __future__ import annotations

import pytest

from megatron_endprompt.data.dataset import find_sidecar
from megatron_endprompt.data.sidecar.sidecar import open_sidecar, sidecar_path
from megatron_endprompt.errors import UserError
from megatron_endprompt.data.coverage import coverage_line
from megatron_endprompt.data.prepare.motif_corpus import write_motif_prefix

P, L = 16, 128


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    return write_motif_prefix(str(tmp_path_factory.mktemp("cov")), seq_length=P,
                              target_length=L, vocab=500, docs=30)


def test_coverage_line_from_recorded_stats(prefix):
    stats = open_sidecar(sidecar_path(prefix)).header.stats
    line = coverage_line(prefix, stats)
    assert f"of {stats['samples_written']:,} samples have a position jump" in line
    assert f"of {stats['tokens_in']:,} tokens used" in line
    tail = {"samples_written": 100, "samples_contiguous_positions": 39, "tokens_in": 1000,
            "tokens_unused_middle": 870, "tokens_left_over_at_end": 0}
    line = coverage_line("p", tail)
    assert "61.0% of 100 samples have a position jump, 13.0% of 1,000 tokens used" in line
    assert "plain short training" not in line
    assert "plain short training" in coverage_line(
        "p", {**tail, "samples_contiguous_positions": 60})
    assert coverage_line("p", {}) is None


def test_mistyped_name_lists_existing_sidecars(prefix):
    with pytest.raises(UserError, match=r"sidecars there: ep\.endprompt"):
        find_sidecar(prefix, seq_length=P, target_length=L, name="L64K")


def test_wrong_target_length_says_rebuild_the_sidecar(prefix):
    with pytest.raises(UserError, match="rebuild the sidecar with tools/build_endprompt_sidecar"):
        find_sidecar(prefix, seq_length=P, target_length=2 * L)


def test_wrong_target_length_of_a_named_sidecar_gives_the_full_command(run_tool, tmp_path):
    """The rebuild command names the sidecar (``--name``): without it the tool would write the
    default sidecar and training would still read the stale named one."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from megatron_endprompt.cli import build_sidecar as sidecar_cli

    prefix = str(tmp_path / "mg")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for n in range(30):
        builder.add_document(np.arange(40 + n) % 500, [40 + n])
    builder.finalize(prefix + ".idx")
    rc, _, err = run_tool(sidecar_cli.main, ["--data-prefix", prefix, "--seq-length", P,
                                             "--target-length", L, "--terminal-length", 4,
                                             "--no-progress", "--name", "L128"])
    assert rc == 0, err
    with pytest.raises(UserError, match=f"--target-length {2 * L} --name L128 \\(the .bin/.idx"):
        find_sidecar(prefix, seq_length=P, target_length=2 * L, name="L128")
