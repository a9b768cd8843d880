"""Training FLOPs of a step: Megatron's ``num_floating_point_operations``, plus what it leaves out.

Megatron counts *model* FLOPs: 3 x forward (forward, data gradient, weight gradient), every
GEMM ``2mnk``, causal core attention counted half (``QK^T`` and ``PV`` over the lower
triangle). Two corrections, each stated where it is used:

* ``attention="local"`` (Megatron's local ``DotProductAttention``, the CPU calibration mode)
  multiplies the full ``S x S`` score matrix and masks it afterwards, so it performs the other
  half too: ``+ 3 * 2 * 2 * S^2 * q / 2 = 6 S^2 q`` per layer and sequence. Flash attention
  skips masked blocks, so the GPU plan keeps Megatron's figure.
* recompute re-runs forward work: ``full`` adds one forward (model FLOPs x 4/3), ``selective``
  re-runs core attention's forward. These *hardware* FLOPs set the step time: the planner's
  ``mfu`` is the fraction of peak the GPUs sustain on the work they execute. Without recompute
  that is Megatron's MFU; with full recompute Megatron's reported (model-FLOP) MFU reads 3/4
  of it.
"""

from __future__ import annotations

from megatron_endprompt.planning.megatron_formulas import MegatronAccounting
from megatron_endprompt.planning.presets import ModelSpec

__all__ = ["core_attention_flops", "hardware_flops", "model_flops"]


def core_attention_flops(model: ModelSpec, seq: int, batch: int) -> float:
    """Megatron's causal core-attention share of training FLOPs: ``6 S^2 q`` per layer and
    sequence (3 passes x 2 per FMA x 2 GEMMs x ``q S^2 / 2``)."""
    return 6.0 * seq * seq * model.query_width * model.num_layers * batch


def model_flops(acc: MegatronAccounting, model: ModelSpec, batch: int, *,
                attention: str = "flash") -> float:
    """Model training FLOPs of ``batch`` sequences of ``acc.ns.seq_length`` tokens."""
    flops = acc.train_flops(batch)
    if attention == "local":
        flops += core_attention_flops(model, acc.ns.seq_length, batch)
    return flops


def hardware_flops(acc: MegatronAccounting, model: ModelSpec, batch: int, *,
                   recompute: str = "none", attention: str = "flash") -> float:
    """FLOPs the GPUs execute, recompute included."""
    flops = model_flops(acc, model, batch, attention=attention)
    if recompute == "full":
        return flops * 4.0 / 3.0
    if recompute == "selective":  # one more forward of core attention
        return flops + core_attention_flops(model, acc.ns.seq_length, batch) / 3.0
    return flops
