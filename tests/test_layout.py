"""Property tests of the EndPrompt layouts (pure numpy)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_endprompt.layout import (
    LayoutConfig,
    describe_runs,
    loss_weights_from_record,
    make_record,
    positions_from_record,
    sample_rng,
)
from megatron_endprompt.loss_weights import LossWeights


@st.composite
def layouts(draw):
    P = draw(st.integers(2, 600))
    L = draw(st.integers(P + 1, 8 * P + 50))
    b = draw(st.integers(1, P - 1))
    a = P - b
    n = draw(st.integers(1, min(a, 6)))
    cfg = LayoutConfig(seq_length=P, target_length=L,
                       placement=draw(st.sampled_from(["fixed", "random"])),
                       pose_chunks=n, loss_weights=LossWeights(
                           terminal=draw(st.floats(1e-3, 2.0)),
                           context=draw(st.sampled_from([0.0, 1.0]))))
    return cfg, b, draw(st.integers(0, 2**31)), draw(st.integers(0, 10**6))


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_layout_properties(case):
    cfg, b, seed, index = case
    P, L, a = cfg.seq_length, cfg.target_length, cfg.seq_length - b
    record = make_record(cfg, terminal_length=b, rng=sample_rng(seed, index))
    assert record.dtype == np.int32 and record.shape == (2 * cfg.pose_chunks,)
    pos = positions_from_record(record, P)
    assert pos.shape == (P,) and pos.dtype == np.int64
    assert np.all(np.diff(pos) > 0), "strictly increasing"
    assert pos[0] == 0 and pos.max() < L
    T = int(record[1])
    # terminal contiguous from T, every context position below T
    assert np.array_equal(pos[a:], np.arange(T, T + b))
    assert np.all(pos[:a] < T)
    assert a <= T <= L - b
    if cfg.placement == "fixed":
        assert pos[-1] == L - 1
    runs = describe_runs(record, P)
    assert len(runs) == cfg.pose_chunks + 1
    assert sum(r[2] for r in runs) == P and all(r[2] > 0 for r in runs)
    # each context piece is contiguous; without PoSE the context is exactly 0..a-1
    for off, first, length in runs:
        assert np.array_equal(pos[off:off + length], np.arange(first, first + length))
    if cfg.pose_chunks == 1:
        assert np.array_equal(pos[:a], np.arange(a))
    w = loss_weights_from_record(record, P, cfg.loss_weights)
    assert w.dtype == np.float32 and w.shape == (P,)
    assert np.all(w[: a - 1] == np.float32(cfg.loss_weights.context))
    assert np.all(w[a - 1:] == np.float32(cfg.loss_weights.terminal))
    # reproducible from (seed, index)
    again = make_record(cfg, terminal_length=b, rng=sample_rng(seed, index))
    assert np.array_equal(record, again)


def test_fixed_layout_matches_paper_example():
    cfg = LayoutConfig(seq_length=8192, target_length=65536)
    rec = make_record(cfg, terminal_length=512, rng=sample_rng(0, 0))
    pos = positions_from_record(rec, 8192)
    assert np.array_equal(pos[:7680], np.arange(7680))
    assert np.array_equal(pos[7680:], np.arange(65536 - 512, 65536))


def test_random_placement_covers_range_and_varies():
    cfg = LayoutConfig(seq_length=16, target_length=64, placement="random")
    starts = {int(make_record(cfg, terminal_length=4, rng=sample_rng(1, i))[1])
              for i in range(2000)}
    assert starts == set(range(12, 61)), "uniform over [a, L-b] inclusive"


def test_pose_skips_use_the_budget():
    cfg = LayoutConfig(seq_length=64, target_length=4096, pose_chunks=3)
    recs = [make_record(cfg, terminal_length=8, rng=sample_rng(2, i)) for i in range(200)]
    last_ctx = [positions_from_record(r, 64)[55] for r in recs]
    assert max(last_ctx) > 1000 and min(last_ctx) >= 55


@pytest.mark.parametrize(
    "kwargs, b, match",
    [
        (dict(seq_length=16, target_length=16), 4, "target length"),
        (dict(seq_length=16, target_length=8), 4, "target length"),
        (dict(seq_length=16, target_length=64, placement="middle"), 4, "placement"),
        (dict(seq_length=16, target_length=64, pose_chunks=0), 4, "pose chunks"),
        (dict(seq_length=16, target_length=64), 16, "terminal length"),
        (dict(seq_length=16, target_length=64), 20, "terminal length"),
        (dict(seq_length=16, target_length=64), 0, "terminal length"),
        (dict(seq_length=16, target_length=64, pose_chunks=5), 12, "pose-chunks"),
    ],
)
def test_validation_names_the_flag(kwargs, b, match):
    with pytest.raises(ValueError, match=match) as info:
        cfg = LayoutConfig(**kwargs)
        make_record(cfg, terminal_length=b, rng=sample_rng(0, 0))
    assert "--" in str(info.value), "the message names the flag to fix"
