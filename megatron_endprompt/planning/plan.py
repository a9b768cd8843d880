"""The run plan: EndPrompt at ``P`` vs full-length training at ``L`` on a given cluster.

For each method the planner searches the cheapest TP x PP x CP layout whose per-GPU memory
(:mod:`.memory`) fits in ``(1 - headroom)`` of the GPU, then estimates throughput from the step's
hardware FLOPs (:mod:`.flops`) at a stated MFU: ``tokens/s = GPUs x peak x MFU / (FLOPs per
token)`` and ``GPU-hours = budget tokens / tokens/s x GPUs / 3600``. Both methods spend the same
token budget (``tokens``): EndPrompt's tokens are physically ``P`` long, full-length ones ``L``.

"Cheapest": the fewest model-parallel GPUs (``TP x PP x CP``), so the most data parallelism and
the least communication; among equals, fewer pipeline stages (bubble), then less TP (TP
moves activations every layer; CP moves only K/V, overlapped with attention), then less CP.
Sequences within the model's original window ``L0`` (EndPrompt's ``P``) take less CP before less
TP: there CP's per-rank chunks are short, so its K/V exchange hides behind little attention
work, and the launch script trains at ``P`` with ``CP=1`` (CP is for evaluation lengths).
TP stays within a node (<= 8) and divides the KV heads; PP divides the layers; CP needs
``seq % (2 CP) == 0`` (Megatron's load-balanced causal split).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from megatron_endprompt.planning.activations import ActivationModel
from megatron_endprompt.planning.flops import hardware_flops, model_flops
from megatron_endprompt.planning.megatron_formulas import MegatronAccounting, megatron_namespace
from megatron_endprompt.planning.memory import GIB, MemoryBreakdown, MixedPrecision, \
    memory_breakdown
from megatron_endprompt.planning.presets import GPUSpec, ModelSpec
from megatron_endprompt.window import PLAN_FLAGS, EndPromptWindow

__all__ = ["Layout", "MethodPlan", "PlanSettings", "evaluate", "plan_method", "plan_run", "sweep",
           "total_params"]

TP_CHOICES = (1, 2, 4, 8)
CP_CHOICES = (1, 2, 4, 8, 16, 32, 64)
MAX_PP = 16


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    """What the team brings: model, cluster, budget, and the knobs they want fixed."""

    model: ModelSpec
    gpu: GPUSpec
    #: GPUs of the cluster (all used: DP = GPUs / (TP PP CP))
    gpus: int
    #: training tokens each method spends
    tokens: float
    #: physical EndPrompt length ``P``
    seq_length: int
    #: target window ``L`` (the full-length run trains at ``L``)
    target_length: int
    micro_batch: int = 1
    #: tokens per optimizer step (global batch = this / sequence length, at least DP x mbs)
    global_batch_tokens: int = 4 * 2 ** 20
    #: ``none`` | ``selective`` | ``full`` (Megatron ``--recompute-granularity``)
    recompute: str = "none"
    #: sustained fraction of peak on the executed FLOPs (= Megatron's MFU without recompute)
    mfu: float = 0.40
    #: fraction of GPU memory kept free (CUDA context, NCCL buffers, fragmentation)
    headroom: float = 0.10
    distributed_optimizer: bool = True
    #: Megatron's fused SwiGLU (default on with ``--swiglu``)
    swiglu_fusion: bool = True
    #: fixed TP / PP / CP (``None``: searched), applied to both methods
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    precision: MixedPrecision = field(default_factory=MixedPrecision)

    def __post_init__(self) -> None:
        checks = [("--gpus", self.gpus), ("--seq-length", self.seq_length),
                  ("--target-length", self.target_length), ("--micro-batch", self.micro_batch),
                  ("--global-batch-tokens", self.global_batch_tokens)]
        for flag, value in checks:
            if value <= 0:
                raise ValueError(f"{flag} must be positive, got {value}")
        if not (math.isfinite(self.tokens) and self.tokens > 0):
            raise ValueError(f"--tokens must be a positive finite number, got {self.tokens:g}")
        try:  # L vs P vs L0 by the rule training uses (L > P, L > L0, int32 positions)
            EndPromptWindow(target_length=self.target_length, seq_length=self.seq_length,
                            original_length=self.model.original_window, flags=PLAN_FLAGS)
        except ValueError as exc:
            raise ValueError(f"--target-length {self.target_length}: {exc}") from None
        if not 0 < self.mfu <= 1:
            raise ValueError(f"--mfu {self.mfu:g}: give a fraction in (0, 1], e.g. 0.4")
        if not 0 <= self.headroom < 1:
            raise ValueError(f"--headroom {self.headroom:g}: give a fraction in [0, 1)")
        for flag, v in (("--tp", self.tp), ("--pp", self.pp), ("--cp", self.cp)):
            if v is not None and (v <= 0 or self.gpus % v):
                raise ValueError(f"{flag} {v} must be positive and divide --gpus {self.gpus}")

    @property
    def usable_bytes(self) -> float:
        return self.gpu.memory_gib * GIB * (1 - self.headroom)

    def activation_model(self) -> ActivationModel:
        return ActivationModel(model=self.model, attention="flash", recompute=self.recompute,
                               bytes_per_value=2, swiglu_fusion=self.swiglu_fusion)


@dataclass(frozen=True, kw_only=True)
class Layout:
    tp: int
    pp: int
    cp: int
    dp: int

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    def cost_key(self, short: bool = False) -> tuple:
        """Sort key, cheapest first; ``short``: sequences within the model's original window,
        where CP is the last resort (see the module docstring)."""
        if short:
            return (self.model_parallel, self.pp, self.cp, self.tp)
        return (self.model_parallel, self.pp, self.tp, self.cp)

    def __str__(self) -> str:
        return f"TP{self.tp} PP{self.pp} CP{self.cp} DP{self.dp}"


@dataclass(frozen=True, kw_only=True)
class MethodPlan:
    """One method's plan: its layout, memory and time."""

    method: str
    seq_length: int
    layout: Layout
    fits: bool
    memory: MemoryBreakdown
    global_batch: int
    num_microbatches: int
    #: Megatron's ``num_floating_point_operations`` for one global batch
    step_model_flops: float
    #: with recompute (see :func:`.flops.hardware_flops`)
    step_hardware_flops: float
    step_seconds: float
    tokens_per_second: float
    gpu_hours: float
    #: Megatron's ``compute_activation_memory`` per GPU (its own formula, for comparison)
    megatron_activation_bytes: float
    #: layouts searched (the chosen one first when none fits: the least memory)
    layouts_tried: int

    def as_dict(self) -> dict:
        return dict(method=self.method, seq_length=self.seq_length,
                    layout=dict(tp=self.layout.tp, pp=self.layout.pp, cp=self.layout.cp,
                                dp=self.layout.dp),
                    fits=self.fits, memory_gib=self.memory.as_gib(),
                    global_batch=self.global_batch, num_microbatches=self.num_microbatches,
                    step_model_flops=self.step_model_flops,
                    step_hardware_flops=self.step_hardware_flops,
                    step_seconds=self.step_seconds, tokens_per_second=self.tokens_per_second,
                    gpu_hours=self.gpu_hours,
                    megatron_activation_gib=self.megatron_activation_bytes / GIB,
                    layouts_tried=self.layouts_tried)


def total_params(model: ModelSpec) -> float:
    """All parameters of ``model``: Megatron's count on a single unsharded rank plus the q/k/v
    biases or per-head q/k norms it leaves out (Qwen2.5-7B: 129,024; Qwen3-8B: 9,216)."""
    ns = megatron_namespace(model, seq_length=model.original_window, micro_batch=1, tp=1, pp=1,
                            cp=1, dp=1)
    return (MegatronAccounting(ns).params_on_most_loaded_shard()
            + model.num_layers * model.attention_extra_params_per_layer)


def candidate_layouts(s: PlanSettings, seq: int) -> list[Layout]:
    """Every admissible layout for sequences of ``seq`` tokens, cheapest first."""
    m = s.model
    out = []
    tps = [s.tp] if s.tp else [t for t in TP_CHOICES if m.num_query_groups % t == 0]
    pps = [s.pp] if s.pp else [p for p in range(1, MAX_PP + 1) if m.num_layers % p == 0]
    cps = [s.cp] if s.cp else list(CP_CHOICES)
    for tp in tps:
        for pp in pps:
            for cp in cps:
                mp = tp * pp * cp
                if s.gpus % mp or (cp > 1 and seq % (2 * cp)):
                    continue
                out.append(Layout(tp=tp, pp=pp, cp=cp, dp=s.gpus // mp))
    short = seq <= m.original_window
    return sorted(out, key=lambda lay: lay.cost_key(short))


def evaluate(s: PlanSettings, method: str, seq: int, layout: Layout, tried: int = 1) -> MethodPlan:
    """The plan of ``method`` at ``seq`` tokens on ``layout``."""
    m = s.model
    ns = megatron_namespace(m, seq_length=seq, micro_batch=s.micro_batch, tp=layout.tp,
                            pp=layout.pp, cp=layout.cp, dp=layout.dp,
                            distributed_optimizer=s.distributed_optimizer, recompute=s.recompute)
    acc = MegatronAccounting(ns)
    per_step = layout.dp * s.micro_batch
    num_mb = max(1, round(s.global_batch_tokens / seq / per_step))
    global_batch = num_mb * per_step
    mem = memory_breakdown(acc, s.activation_model(), num_microbatches=num_mb,
                           precision=s.precision, distributed_optimizer=s.distributed_optimizer)
    step_model = model_flops(acc, m, global_batch)
    step_hw = hardware_flops(acc, m, global_batch, recompute=s.recompute)
    cluster_flops = s.gpus * s.gpu.peak_tflops * 1e12 * s.mfu
    # ``mfu`` applies to the executed (hardware) FLOPs: recompute's extra work costs time.
    step_seconds = step_hw / cluster_flops
    tps = global_batch * seq / step_seconds
    megatron_act = acc.activation_bytes(num_mb) / layout.cp
    return MethodPlan(method=method, seq_length=seq, layout=layout,
                      fits=mem.total <= s.usable_bytes, memory=mem, global_batch=global_batch,
                      num_microbatches=num_mb, step_model_flops=step_model,
                      step_hardware_flops=step_hw, step_seconds=step_seconds,
                      tokens_per_second=tps, gpu_hours=s.tokens / tps * s.gpus / 3600,
                      megatron_activation_bytes=megatron_act, layouts_tried=tried)


def plan_method(s: PlanSettings, method: str, seq: int) -> MethodPlan:
    """The cheapest fitting layout for ``seq``-token sequences, or (``fits=False``) the layout
    needing the least memory when none fits."""
    layouts = candidate_layouts(s, seq)
    if not layouts:
        raise ValueError(f"no TP/PP/CP layout of {s.model.name} divides --gpus {s.gpus} at "
                         f"sequence length {seq}; change --gpus or the fixed --tp/--pp/--cp")
    best = None
    for i, layout in enumerate(layouts, 1):
        p = evaluate(s, method, seq, layout, i)
        if p.fits:
            return p
        if best is None or p.memory.total < best.memory.total:
            best = p
    return best


def plan_run(s: PlanSettings) -> dict[str, MethodPlan]:
    """``{"endprompt": plan at P, "full": plan at L, "full_same_layout": full-length at L on
    EndPrompt's layout}`` -- the last is the like-for-like memory comparison."""
    ep = plan_method(s, "endprompt", s.seq_length)
    return {"endprompt": ep, "full": plan_method(s, "full", s.target_length),
            "full_same_layout": evaluate(s, "full", s.target_length, ep.layout)}


def sweep(s: PlanSettings, lengths: list[int]) -> list[dict]:
    """Plans of both methods for each target ``L`` (EndPrompt stays at ``P``: only its
    positions change with ``L``, its cost does not)."""
    ep = plan_method(s, "endprompt", s.seq_length)
    rows = []
    for L in lengths:
        rows.append(dict(target_length=L, endprompt=ep, full=plan_method(s, "full", L),
                         full_same_layout=evaluate(s, "full", L, ep.layout)))
    return rows
