"""Per-GPU memory of one training layout: weights, gradients, optimizer states, activations.

Weights, gradients and optimizer states come from Megatron's
``compute_weight_and_optimizer_memory`` (via :class:`.MegatronAccounting`): its parameter count
on the most loaded shard, times Megatron's mixed-precision bytes -- bf16 weights (2), fp32 main
gradients in the DDP buffer (4), fp32 main weights + Adam moments (12), the last sharded over the
DP x CP ranks by the distributed optimizer (Megatron-Core's ``intra_distributed_optimizer``
group includes CP; Megatron's formula divides by DP alone). Activations are
:class:`.ActivationModel`'s. The peak is taken at the forward/backward boundary: the static part
plus the saved activations plus the logits' transient copy (see
:meth:`.ActivationModel.logits_transient_bytes`); CUDA context, NCCL buffers and allocator
fragmentation are left to the planner's headroom.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from megatron_endprompt.planning.activations import ActivationModel, StageActivations
from megatron_endprompt.planning.megatron_formulas import MegatronAccounting

__all__ = ["MemoryBreakdown", "MixedPrecision", "memory_breakdown"]

GIB = 2 ** 30


@dataclass(frozen=True, kw_only=True)
class MixedPrecision:
    """Bytes per parameter of each kind of model state."""

    #: the model's weights (bf16)
    weight_bytes: float = 2
    #: the gradient buffer (Megatron DDP keeps fp32 ``main_grad``)
    grad_bytes: float = 4
    #: fp32 main weights + Adam ``m`` and ``v`` (0: no optimizer, as in the step benchmark)
    optimizer_bytes: float = 12


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Bytes on one GPU of the most loaded model shard."""

    #: parameters on the most loaded (TP, PP) shard (Megatron's count)
    params: float
    weights: float
    gradients: float
    optimizer: float
    activations: StageActivations
    #: the logits' activation-dtype copy beside the fp32 one (see ``logits_transient_bytes``)
    logits_transient: float

    @property
    def static(self) -> float:
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return self.static + self.activations.total + self.logits_transient

    def as_gib(self) -> dict:
        a = self.activations
        return dict(params_billion=self.params / 1e9, weights=self.weights / GIB,
                    gradients=self.gradients / GIB, optimizer=self.optimizer / GIB,
                    activations=a.total / GIB, activations_per_layer=a.per_layer / GIB,
                    activations_layers=a.layers / GIB,
                    activations_outside_layers=a.outside_layers / GIB,
                    recompute_buffer=a.recompute_buffer / GIB, activation_stage=a.stage,
                    logits_transient=self.logits_transient / GIB, total=self.total / GIB)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["total"] = self.total
        return d


def memory_breakdown(acc: MegatronAccounting, act: ActivationModel, *, num_microbatches: int,
                     precision: MixedPrecision = MixedPrecision(),
                     distributed_optimizer: bool = True) -> MemoryBreakdown:
    """Memory of the layout in ``acc.ns`` (TP/PP/CP/DP, sequence length, micro-batch)."""
    ns = acc.ns
    tp, pp, cp, dp = (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size,
                      ns.context_parallel_size, ns.data_parallel_size)
    params = acc.params_on_most_loaded_shard()
    shards = dp * cp if distributed_optimizer else 1
    stage = act.stage(seq=ns.seq_length, micro_batch=ns.micro_batch_size, tp=tp, pp=pp, cp=cp,
                      num_microbatches=num_microbatches, vocab=ns.padded_vocab_size)
    last_stage = pp == 1 or stage.stage == "last"
    transient = act.logits_transient_bytes(seq=ns.seq_length, micro_batch=ns.micro_batch_size,
                                           tp=tp, cp=cp, vocab=ns.padded_vocab_size)
    return MemoryBreakdown(
        params=params, weights=params * precision.weight_bytes,
        gradients=params * precision.grad_bytes,
        optimizer=params * precision.optimizer_bytes / shards,
        activations=stage, logits_transient=transient if last_stage else 0.0)
