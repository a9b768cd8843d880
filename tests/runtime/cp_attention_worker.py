"""torchrun worker (4 ranks) for test_cp_attention.py: the CPU context-parallel attention
through real gloo collectives equals unsharded attention, forward and every gradient, for
CP = 4 (the world) and CP = 2 (ranks {0, 1} and {2, 3}). Writes ``OUT/rank<R>.ok`` on success."""

from __future__ import annotations

import argparse
import os
from types import SimpleNamespace

from tests.support.torchrun import install_rank_runtime


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    a = p.parse_args()

    install_rank_runtime()
    import torch
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel

    from tests.runtime.cp_attention_cases import (
        CASES,
        assert_close,
        attention,
        inputs,
        rank_slice,
        reference,
    )

    torch.distributed.init_process_group("gloo")
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    mpu.initialize_model_parallel(context_parallel_size=world)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)  # the RNG tracker stock forward forks
    halves = [torch.distributed.new_group([0, 1]), torch.distributed.new_group([2, 3])]
    groups = {world: mpu.get_context_parallel_group(), 2: halves[rank // 2]}
    for cp, batch, heads, kv_groups, dim, seq in CASES:
        group = groups[cp]
        cp_rank = torch.distributed.get_rank(group)
        q, k, v, w = inputs(batch, heads, kv_groups, dim, seq, seed=cp + rank // cp)
        ref = reference(q, k, v, w, heads, kv_groups, dim)
        local = [rank_slice(t, cp, cp_rank).requires_grad_() for t in (q, k, v)]
        module = attention(cp, heads, kv_groups, dim,
                           pg_collection=SimpleNamespace(tp=mpu.get_tensor_model_parallel_group(),
                                                         cp=group))
        out = module(*local, None)
        assert_close(out.detach(), rank_slice(ref.out, cp, cp_rank), f"CP={cp} output")
        (out * rank_slice(w, cp, cp_rank)).sum().backward()
        for leaf, want, name in zip(local, (ref.dq, ref.dk, ref.dv), "qkv"):
            assert_close(leaf.grad, rank_slice(want, cp, cp_rank), f"CP={cp} d{name}")
    open(os.path.join(a.out, f"rank{rank}.ok"), "w").close()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
