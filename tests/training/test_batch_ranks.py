"""Positions reach every TP/PP/CP rank: ``get_batch`` under real process groups (gloo)."""

from __future__ import annotations

import os

import pytest
import torch

from megatron_endprompt.model.cp import zigzag_slice
from tests.support.torchrun import run_torchrun

HERE = os.path.dirname(os.path.abspath(__file__))


def make_batch() -> dict[str, torch.Tensor]:
    """Three rows, S=16, L=128: a fixed EndPrompt layout, a PoSE one, and a random placement
    that drew ``T = a`` (a = 10: no position jump, the terminal known only to the dataset)."""
    pos = torch.stack([torch.cat([torch.arange(12), torch.arange(124, 128)]),
                       torch.cat([torch.arange(5), torch.arange(40, 47), torch.arange(90, 94)]),
                       torch.arange(16)])
    tokens = torch.arange(48).view(3, 16) + 100
    a = torch.tensor([12, 12, 10])
    terminal = (torch.arange(16)[None, :] >= (a - 1)[:, None]).float()
    return {"tokens": tokens, "labels": tokens + 1, "position_ids": pos,
            "loss_mask": torch.where(terminal > 0, 0.25, 1.0).float(),
            "terminal_mask": terminal}


#: The layouts, each on 2 ranks: one torchrun job runs them all (the groups rebuilt for each)
LAYOUTS = [dict(tp=2), dict(pp=2), dict(cp=2)]


def _name(layout: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in layout.items())


@pytest.fixture(scope="module")
def received(tmp_path_factory) -> dict[str, list[dict]]:
    """``{layout name: [what each rank received]}`` from one 2-rank job over :data:`LAYOUTS`."""
    out = tmp_path_factory.mktemp("batch_ranks")
    proc = run_torchrun(os.path.join(HERE, "batch_worker.py"), "--out", out,
                        *[f"--layout={_name(layout)}" for layout in LAYOUTS], nproc=2)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return {_name(layout): [torch.load(out / _name(layout) / f"rank{r}.pt") for r in range(2)]
            for layout in LAYOUTS}


@pytest.mark.process
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_rank_gets_its_positions(received, layout):
    full = make_batch()
    cp = layout.get("cp", 1)
    pp = layout.get("pp", 1)
    assert layout.get("tp", 1) * pp * cp == 2  # the job's world size
    ranks = received[_name(layout)]
    # this layout's groups, not the previous layout's, were in force
    assert [got["cp_rank"] for got in ranks] == ([0, 1] if cp > 1 else [0, 0])
    assert [got["first"] for got in ranks] == ([True, False] if pp > 1 else [True, True])
    for got in ranks:
        r = got["cp_rank"]
        expect = {k: zigzag_slice(v, cp_size=cp, cp_rank=r, seq_dim=1) if cp > 1 else v
                  for k, v in full.items()}
        assert torch.equal(got["position_ids"], expect["position_ids"]), "positions on every rank"
        if got["first"]:
            assert torch.equal(got["tokens"], expect["tokens"])
        if got["last"]:
            for k in ("labels", "loss_mask", "terminal_mask"):
                assert torch.equal(got[k], expect[k]), k
            assert got["loss_mask"].dtype == torch.float32
        if not got["first"]:
            assert "tokens" not in got
