"""The planner's LoRA row: an EndPrompt run at ``P`` training adapters on a frozen base.

Memory per GPU (Megatron's mixed precision, as :mod:`.memory`): the frozen base in bf16
(2 bytes per parameter, no gradient, no optimizer state), the adapters' bf16 weights (2), fp32
main gradients (4) and fp32 main weights + Adam moments (12, sharded over DP x CP by the
distributed optimizer), and the same activations as full fine-tuning (the frozen linears'
inputs are still saved: the adapters' ``A`` needs them for its gradient, and the backward
through ``W`` runs for every layer below the top one). The adapters are counted on the whole
model and spread like the base over the shards (their share, ``adapters / parameters``, is what
:class:`~.memory.MixedPrecision` is given), which the TP-replicated factors exceed by at most
``r * (H + F/tp)`` per layer: well under 0.1 % of a shard here. Time: the step's FLOPs as full
fine-tuning's (the weight gradients of the frozen base are skipped, ~1/3 of the backward, which
this estimate does not credit).
"""

from __future__ import annotations

import dataclasses

from megatron_endprompt.planning.memory import GIB, MixedPrecision
from megatron_endprompt.planning.plan import MethodPlan, PlanSettings, plan_method, total_params
from megatron_endprompt.planning.presets import ModelSpec

__all__ = ["adapter_params", "lora_plan", "lora_settings", "lora_text"]


def adapter_params(model: ModelSpec, rank: int) -> int:
    """Adapter parameters of the whole model with rank ``rank`` on ``linear_qkv``,
    ``linear_proj``, ``linear_fc1`` (SwiGLU: ``2F`` rows) and ``linear_fc2``:
    ``r (in + out)`` per linear and layer."""
    H, F, d = model.hidden_size, model.ffn_hidden_size, model.head_dim
    qkv_out = (model.num_attention_heads + 2 * model.num_query_groups) * d
    per_layer = (H + qkv_out) + (model.num_attention_heads * d + H) + (H + 2 * F) + (F + H)
    return rank * per_layer * model.num_layers


def lora_settings(s: PlanSettings, rank: int) -> PlanSettings:
    """``s`` with LoRA's bytes per parameter (see the module docstring)."""
    share = adapter_params(s.model, rank) / total_params(s.model)
    return dataclasses.replace(s, precision=MixedPrecision(
        weight_bytes=2 * (1 + share), grad_bytes=4 * share, optimizer_bytes=12 * share))


def lora_plan(s: PlanSettings, rank: int) -> MethodPlan:
    """The cheapest fitting layout of EndPrompt at ``P`` with rank-``rank`` adapters (or the
    least memory when none fits)."""
    return plan_method(lora_settings(s, rank), "endprompt_lora", s.seq_length)


def lora_text(s: PlanSettings, rank: int, plan: MethodPlan, launch: str) -> str:
    """The plan's LoRA lines: trainable parameters, memory per GPU, whether it fits, and the
    launch line (``launch``: the launcher's variables for ``plan``) with ``LORA_RANK``."""
    trainable = adapter_params(s.model, rank)
    m = plan.memory.as_gib()
    verdict = "fits" if plan.fits else "does NOT fit"
    return "\n".join([
        f"LoRA r={rank} (EndPrompt at P={s.seq_length}, base frozen): {trainable / 1e6:.1f}M "
        f"trainable parameters ({100 * trainable / total_params(s.model):.2f}% of "
        f"{total_params(s.model) / 1e9:.2f}B)",
        f"  per GPU on {plan.layout}: base + adapter weights {m['weights']:.1f} GiB, adapter "
        f"gradients {m['gradients']:.2f} GiB, adapter Adam {m['optimizer']:.2f} GiB, "
        f"activations {m['activations'] + m['logits_transient']:.1f} GiB, total "
        f"{m['total']:.1f} of {s.usable_bytes / GIB:.1f} GiB usable: {verdict}",
        f"  launch: {launch} LORA_RANK={rank}"])
