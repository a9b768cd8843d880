"""torchrun worker for test_batch_ranks.py: runs ``get_batch`` under a TP/PP/CP layout on
CPU/gloo with a known batch and writes what this rank received to ``OUT/rank<R>.pt``."""

from __future__ import annotations

import argparse
import os
import sys


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args()

    from megatron_endprompt import runtime

    runtime.install()
    import torch
    from megatron.core import parallel_state as mpu
    from megatron.training import global_vars

    from megatron_endprompt.training.batch import get_batch

    torch.distributed.init_process_group("gloo")
    mpu.initialize_model_parallel(tensor_model_parallel_size=a.tp,
                                  pipeline_model_parallel_size=a.pp,
                                  context_parallel_size=a.cp)
    global_vars._GLOBAL_ARGS = argparse.Namespace(micro_batch_size=3, seq_length=16,
                                                  create_attention_mask_in_dataloader=False)
    from test_batch_ranks import make_batch  # noqa: E402  (same directory)

    batch = make_batch()
    it = iter([batch]) if mpu.get_tensor_model_parallel_rank() == 0 else None
    got = get_batch(it, first_stage=mpu.is_pipeline_first_stage(),
                    last_stage=mpu.is_pipeline_last_stage())
    got = {k: v for k, v in got.items() if v is not None}
    got["cp_rank"] = mpu.get_context_parallel_rank()
    got["first"] = mpu.is_pipeline_first_stage()
    got["last"] = mpu.is_pipeline_last_stage()
    torch.save(got, os.path.join(a.out, f"rank{torch.distributed.get_rank()}.pt"))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
