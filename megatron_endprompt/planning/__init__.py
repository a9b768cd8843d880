"""Plan a cluster run on paper: per-GPU memory, FLOPs, time and cost of EndPrompt at ``P`` vs
full-length training at ``L``, and the cheapest TP/PP/CP layout that fits.

``presets`` (models, GPUs, ``--hf-config``) -> ``megatron_formulas`` (Megatron-LM's own memory
and FLOP functions, called) -> ``activations`` / ``memory`` / ``flops`` -> ``plan`` (layout
search, throughput) -> ``report`` (table, JSON, plot). CLI: ``tools/plan_endprompt_run.py``.
"""

from megatron_endprompt.planning.activations import ActivationModel
from megatron_endprompt.planning.memory import MemoryBreakdown, MixedPrecision
from megatron_endprompt.planning.plan import Layout, MethodPlan, PlanSettings, plan_run, sweep
from megatron_endprompt.planning.presets import GPU_PRESETS, MODEL_PRESETS, GPUSpec, ModelSpec

__all__ = ["GPU_PRESETS", "MODEL_PRESETS", "ActivationModel", "GPUSpec", "Layout",
           "MemoryBreakdown", "MethodPlan", "MixedPrecision", "ModelSpec", "PlanSettings",
           "plan_run", "sweep"]
