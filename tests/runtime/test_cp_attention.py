"""The CPU runtime's context-parallel core attention equals unsharded attention: forward and
the gradients of q, k and v, for CP = 2 and 4, GQA, batch > 1.

In process (fast): the zig-zag index and mask logic, and each rank's attention over the whole
sequence's keys (what the all-gather hands it) with the ranks' key/value gradients summed (what
the reduce-scatter does). Under ``torchrun`` (``process``): real gloo ranks through the
collectives, CP = 4 over the world and CP = 2 over two halves of it, in one launch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from megatron_endprompt.launch import single_process_group
from megatron_endprompt.runtime import cpu_forward
from megatron_endprompt.runtime.cp_attention import causal_cp_mask, global_order
from tests.runtime.cp_attention_cases import (
    CASES,
    assert_close,
    attention,
    inputs,
    rank_slice,
    reference,
)
from tests.support.torchrun import run_torchrun

WORKER = Path(__file__).with_name("cp_attention_worker.py")


@pytest.fixture(scope="module")
def megatron_cpu():
    with single_process_group(), cpu_forward():
        yield


@pytest.mark.parametrize("cp", [2, 4])
def test_global_order_undoes_the_gather_of_zigzag_parts(cp: int) -> None:
    seq = 8 * cp
    tokens = torch.arange(seq)
    gathered = torch.cat([rank_slice(tokens, cp, r) for r in range(cp)])
    assert torch.equal(gathered[global_order(seq, cp)], tokens)


@pytest.mark.parametrize("cp", [2, 4])
def test_mask_rows_are_the_full_causal_mask_at_global_indices(cp: int) -> None:
    seq = 4 * cp
    full = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)  # True = masked
    for r in range(cp):
        assert torch.equal(causal_cp_mask(seq, cp, r)[0, 0], rank_slice(full, cp, r))
    # rank 0 holds the first and the last chunk: its last query sees every key
    assert not causal_cp_mask(seq, cp, 0)[0, 0, -1].any()


@pytest.mark.parametrize("case", CASES, ids=[f"cp{c[0]}" for c in CASES])
def test_ranks_over_gathered_keys_equal_unsharded_attention(case, megatron_cpu) -> None:
    cp, batch, heads, groups, dim, seq = case
    q, k, v, w = inputs(batch, heads, groups, dim, seq)
    ref = reference(q, k, v, w, heads, groups, dim)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    module = attention(cp, heads, groups, dim)
    total = 0
    for r in range(cp):
        out = module.attend_gathered(rank_slice(leaves[0], cp, r), leaves[1], leaves[2], None,
                                     cp_size=cp, cp_rank=r)
        assert_close(out.detach(), rank_slice(ref.out, cp, r), f"rank {r} output")
        total = total + (out * rank_slice(w, cp, r)).sum()
    total.backward()
    for leaf, want, name in zip(leaves, (ref.dq, ref.dk, ref.dv), "qkv"):
        assert_close(leaf.grad, want, f"d{name}")


@pytest.mark.process
def test_gloo_ranks_equal_unsharded_attention(tmp_path) -> None:
    proc = run_torchrun(WORKER, "--out", tmp_path, nproc=4)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    done = sorted(p.name for p in tmp_path.glob("rank*.ok"))
    assert done == [f"rank{r}.ok" for r in range(4)], done
