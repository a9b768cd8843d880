"""torchrun worker for test_batch_ranks.py: runs ``get_batch`` under each TP/PP/CP layout given
(one after another in this job, the model-parallel groups rebuilt for each) on CPU/gloo with a
known batch and writes what this rank received to ``OUT/<layout>/rank<R>.pt``."""

from __future__ import annotations

import argparse
import os
import sys

from tests.support.torchrun import install_rank_runtime


def _layout(text: str) -> dict[str, int]:
    """``tp=2`` / ``pp=2,cp=1`` -> ``{"tp": 2}`` / ``{"pp": 2, "cp": 1}``."""
    return {k: int(v) for k, v in (item.split("=") for item in text.split(","))}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layout", action="append", required=True, metavar="tp=N,pp=N,cp=N",
                   help="a layout to run (repeatable; each must use every rank)")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    install_rank_runtime(verbose=True)
    import torch
    from megatron.core import parallel_state as mpu
    from megatron.training import global_vars

    from megatron_endprompt.training.batch import get_batch

    torch.distributed.init_process_group("gloo")
    global_vars._GLOBAL_ARGS = argparse.Namespace(micro_batch_size=3, seq_length=16,
                                                  create_attention_mask_in_dataloader=False)
    from test_batch_ranks import make_batch  # noqa: E402  (same directory)

    for text in a.layout:
        layout = _layout(text)
        mpu.initialize_model_parallel(tensor_model_parallel_size=layout.get("tp", 1),
                                      pipeline_model_parallel_size=layout.get("pp", 1),
                                      context_parallel_size=layout.get("cp", 1))
        batch = make_batch()
        it = iter([batch]) if mpu.get_tensor_model_parallel_rank() == 0 else None
        got = get_batch(it, first_stage=mpu.is_pipeline_first_stage(),
                        last_stage=mpu.is_pipeline_last_stage())
        got = {k: v for k, v in got.items() if v is not None}
        got["cp_rank"] = mpu.get_context_parallel_rank()
        got["first"] = mpu.is_pipeline_first_stage()
        got["last"] = mpu.is_pipeline_last_stage()
        out = os.path.join(a.out, text)
        os.makedirs(out, exist_ok=True)
        torch.save(got, os.path.join(out, f"rank{torch.distributed.get_rank()}.pt"))
        mpu.destroy_model_parallel()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
