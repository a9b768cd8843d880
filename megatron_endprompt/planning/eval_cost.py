"""The cost of evaluating at the target length ``L`` -- the one cost of an EndPrompt run that
grows with ``L`` (training stays at ``P``).

Per sample, a prefill of ``L`` tokens (forward only): Megatron's ``num_floating_point_operations``
for one sequence of ``L`` tokens divided by its 3 passes, so every GEMM including the logits and
causal core attention (``2 L^2 q`` per layer: ``QK^T`` and ``PV`` over the lower triangle) are
counted. Decoding the short answers (RULER: at most 128 tokens) is not counted. GPU-seconds:
``samples x prefill FLOPs / (peak bf16 x MFU)`` at the training plan's MFU (a prefill is as
compute-bound as a training step). Memory of one sample at ``L`` (batch 1, bf16): weights, the
KV cache (``2 x layers x KV width x L x 2 B``), the largest transient activation of a layer (the
SwiGLU MLP's ``L x 3 ffn`` values: gate, up and their product) and logits at every position in
fp32 (``L x vocab x 4 B``: log-likelihood and perplexity scoring; ``generate`` keeps one
position).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from megatron_endprompt.planning.flops import core_attention_flops
from megatron_endprompt.planning.megatron_formulas import MegatronAccounting, megatron_namespace
from megatron_endprompt.planning.plan import PlanSettings, total_params
from megatron_endprompt.window import MAX_POSITION

__all__ = ["EvalCost", "RULER_TASKS", "eval_cost"]

#: RULER's 13 tasks (8 NIAH variants, variable tracking, common/frequent words, 2 QA;
#: Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?").
RULER_TASKS = 13


@dataclass(frozen=True, kw_only=True)
class EvalCost:
    """Evaluation of ``tasks x samples_per_task`` samples of ``length`` tokens."""

    length: int
    """``L``: tokens of each evaluated sample."""
    tasks: int
    """Tasks of the suite (RULER: 13)."""
    samples_per_task: int
    """Samples per task at ``length``."""
    prefill_flops: float
    """Forward FLOPs of one sample (Megatron's count / 3), attention included."""
    attention_flops: float
    """Of which causal core attention, ``2 L^2 q`` per layer: the term quadratic in ``L``."""
    gpu_seconds: float
    """All samples' prefills at the plan's MFU."""
    weights_bytes: float
    """bf16 weights."""
    kv_cache_bytes: float
    """K and V of every layer for ``length`` tokens, bf16."""
    activation_bytes: float
    """The largest transient of a layer: the SwiGLU MLP's ``L x 3 ffn`` bf16 values."""
    logits_bytes: float
    """fp32 logits at every position (scoring); ``generate`` needs one position."""

    @property
    def samples(self) -> int:
        return self.tasks * self.samples_per_task

    @property
    def memory_bytes(self) -> float:
        """One sample at ``L`` on one GPU (batch 1, nothing split)."""
        return self.weights_bytes + self.kv_cache_bytes + self.activation_bytes + self.logits_bytes

    def gpus_for_memory(self, usable_bytes: float) -> int:
        """GPUs (CP/TP ranks) whose usable memory together holds :attr:`memory_bytes`."""
        return max(1, math.ceil(self.memory_bytes / usable_bytes))

    def as_dict(self) -> dict:
        return dict(length=self.length, tasks=self.tasks, samples_per_task=self.samples_per_task,
                    prefill_flops=self.prefill_flops, attention_flops=self.attention_flops,
                    gpu_seconds=self.gpu_seconds, weights_bytes=self.weights_bytes,
                    kv_cache_bytes=self.kv_cache_bytes, activation_bytes=self.activation_bytes,
                    logits_bytes=self.logits_bytes, memory_bytes=self.memory_bytes)


def eval_cost(s: PlanSettings, *, length: int, tasks: int = RULER_TASKS,
              samples_per_task: int = 100) -> EvalCost:
    """The cost of ``tasks x samples_per_task`` prefills of ``length`` tokens on ``s.gpu``."""
    if length <= 0 or tasks <= 0 or samples_per_task <= 0:
        raise ValueError(f"--eval-length {length}, --eval-tasks {tasks}, --eval-samples "
                         f"{samples_per_task}: each must be positive")
    if length > MAX_POSITION:  # the bound training and preprocessing put on L
        raise ValueError(f"--eval-length {length} exceeds {MAX_POSITION:,}, the largest "
                         "position an int32 holds (the bound on --target-length); give an "
                         "evaluation length the model can address")
    m = s.model
    ns = megatron_namespace(m, seq_length=length, micro_batch=1, tp=1, pp=1, cp=1, dp=1)
    prefill = MegatronAccounting(ns).train_flops(1) / 3.0
    attention = core_attention_flops(m, length, 1) / 3.0
    seconds = tasks * samples_per_task * prefill / (s.gpu.peak_tflops * 1e12 * s.mfu)
    bf16 = 2
    return EvalCost(length=length, tasks=tasks, samples_per_task=samples_per_task,
                    prefill_flops=prefill, attention_flops=attention, gpu_seconds=seconds,
                    weights_bytes=total_params(m) * bf16,
                    kv_cache_bytes=2 * m.num_layers * m.kv_width * length * bf16,
                    activation_bytes=3 * m.ffn_hidden_size * length * bf16,
                    logits_bytes=m.vocab_size * length * 4)
