"""The planner's side of examples/pretrain_llama3_endprompt.sh: the script's defaults (so the
planner plans what the script launches) and the ready-to-paste line of script variables for a
plan, with the wall-clock and per-save checkpoint size that go with it.

``SCRIPT_DEFAULTS`` mirrors the script's ``VAR=${VAR:-default}`` lines; a test
(tests/planning/test_launch_vars.py) reads the script and fails when the two differ.
"""

from __future__ import annotations

import math

from megatron_endprompt.planning.plan import MethodPlan, PlanSettings, total_params

__all__ = ["SCRIPT_DEFAULTS", "checkpoint_bytes", "launch_line", "wall_clock_hours"]

#: examples/pretrain_llama3_endprompt.sh defaults the planner depends on.
SCRIPT_DEFAULTS: dict[str, str] = {
    "TP": "4", "PP": "1", "CP": "1", "GPUS_PER_NODE": "8", "MICRO_BATCH": "1",
    "GLOBAL_BATCH": "128", "SEQ_LENGTH": "8192", "ORIGINAL_LENGTH": "8192",
    "TARGET_LENGTH": "65536", "RECOMPUTE": "selective",
}

#: Bytes per parameter in a ``torch_dist`` save with the distributed Adam optimizer: bf16
#: weights (2) + fp32 main weights (4) + Adam first and second moments (4 + 4).
CHECKPOINT_BYTES_PER_PARAM = 14


def checkpoint_bytes(s: PlanSettings) -> float:
    """One save: all parameters x :data:`CHECKPOINT_BYTES_PER_PARAM` (8.03e9 x 14 = 112 GB for
    Llama-3 8B); weights only would be 2 bytes a parameter."""
    return total_params(s.model) * CHECKPOINT_BYTES_PER_PARAM


def wall_clock_hours(s: PlanSettings, plan: MethodPlan) -> float:
    """Hours for the token budget at the plan's tokens/s (all GPUs together)."""
    return s.tokens / plan.tokens_per_second / 3600


def launch_line(s: PlanSettings, plan: MethodPlan, gpus_per_node: int = 8) -> str:
    """``TP=.. PP=.. CP=.. MICRO_BATCH=.. GLOBAL_BATCH=.. NNODES=.. GPUS_PER_NODE=..
    SEQ_LENGTH=.. TARGET_LENGTH=.. TRAIN_ITERS=..`` for the launch script (EndPrompt plan)."""
    nodes = max(1, math.ceil(s.gpus / gpus_per_node))
    per_node = min(gpus_per_node, s.gpus)
    iters = max(1, math.ceil(s.tokens / (plan.global_batch * plan.seq_length)))
    lay = plan.layout
    return (f"TP={lay.tp} PP={lay.pp} CP={lay.cp} MICRO_BATCH={s.micro_batch} "
            f"GLOBAL_BATCH={plan.global_batch} NNODES={nodes} GPUS_PER_NODE={per_node} "
            f"SEQ_LENGTH={s.seq_length} ORIGINAL_LENGTH={s.model.original_window} "
            f"TARGET_LENGTH={s.target_length} TRAIN_ITERS={iters}")
