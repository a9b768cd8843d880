"""Text table, JSON document and plot of a run plan (the CLI only prints what these return)."""

from __future__ import annotations

import os


from megatron_endprompt.disk import atomic_path
from megatron_endprompt.planning.eval_cost import EvalCost
from megatron_endprompt.planning.memory import GIB
from megatron_endprompt.planning.plan import MethodPlan, PlanSettings, total_params

__all__ = ["eval_text", "plan_document", "plan_table", "sweep_table", "write_plot"]

SOURCES = {
    "weights/gradients/optimizer": "Megatron compute_weight_and_optimizer_memory (parameters on "
                                   "the most loaded shard) x 2 / 4 / 12 bytes, optimizer sharded "
                                   "over DP x CP",
    "activations": "megatron_endprompt.planning.activations (Megatron-Core layer inventory, "
                   "flash attention, bf16; calibrated on CPU against saved-tensor bytes)",
    "megatron_activation_gib": "Megatron compute_activation_memory / CP (selective-recompute "
                               "formula, q = h), for comparison",
    "flops": "Megatron num_floating_point_operations (model FLOPs); recompute adds hardware FLOPs",
    "time": "tokens/s = GPUs x peak bf16 x MFU / hardware FLOPs per token",
}


def _settings_dict(s: PlanSettings) -> dict:
    m = s.model
    return dict(model=dict(name=m.name, params=total_params(m), layers=m.num_layers,
                           hidden=m.hidden_size,
                           ffn=m.ffn_hidden_size, heads=m.num_attention_heads,
                           kv_heads=m.num_query_groups, head_dim=m.head_dim, vocab=m.vocab_size,
                           tied=m.tied, original_window=m.original_window),
                gpu=dict(name=s.gpu.name, memory_gib=s.gpu.memory_gib,
                         peak_tflops=s.gpu.peak_tflops),
                gpus=s.gpus, tokens=s.tokens, seq_length=s.seq_length,
                target_length=s.target_length, micro_batch=s.micro_batch,
                global_batch_tokens=s.global_batch_tokens, recompute=s.recompute, mfu=s.mfu,
                headroom=s.headroom, usable_gib=s.usable_bytes / GIB,
                distributed_optimizer=s.distributed_optimizer, swiglu_fusion=s.swiglu_fusion,
                fixed=dict(tp=s.tp, pp=s.pp, cp=s.cp))


def plan_document(s: PlanSettings, plans: dict[str, MethodPlan], rows: list[dict]) -> dict:
    """The ``--json`` document."""
    return dict(settings=_settings_dict(s), plans={k: p.as_dict() for k, p in plans.items()},
                sweep=[dict(target_length=r["target_length"], endprompt=r["endprompt"].as_dict(),
                            full=r["full"].as_dict(),
                            full_same_layout=r["full_same_layout"].as_dict()) for r in rows],
                sources=SOURCES)


def _layout(p: MethodPlan) -> str:
    return str(p.layout) + ("" if p.fits else " OOM")


def plan_table(s: PlanSettings, plans: dict[str, MethodPlan]) -> str:
    ep, full = plans["endprompt"], plans["full"]
    m = s.model
    params = total_params(m)
    lines = [
        f"{m.name}: {m.num_layers} layers, h {m.hidden_size}, {m.num_attention_heads}/"
        f"{m.num_query_groups} heads, ffn {m.ffn_hidden_size}, vocab {m.vocab_size} "
        f"({params / 1e9:.2f}B params)",
        f"cluster: {s.gpus} x {s.gpu.name} ({s.gpu.memory_gib:g} GiB, {s.gpu.peak_tflops:g} "
        f"TFLOP/s bf16 dense); fits = total <= {s.usable_bytes / GIB:.1f} GiB "
        f"({100 * s.headroom:g}% headroom)",
        f"assumptions: MFU {100 * s.mfu:g}% (of peak, on executed FLOPs), recompute {s.recompute}, "
        f"micro-batch {s.micro_batch}, {_step_tokens(s, ep, full)}, bf16 + "
        f"{'distributed ' if s.distributed_optimizer else ''}Adam, flash attention, "
        f"{s.tokens:.3g} tokens per method",
        "",
    ]
    head = (f"{'':38s}{'EndPrompt P=' + str(ep.seq_length):>22s}"
            f"{'full-length L=' + str(full.seq_length):>24s}")
    lines.append(head)

    def row(label: str, f, fmt: str = "{:.2f}") -> None:
        a, b = f(ep), f(full)
        lines.append(f"{label:38s}{fmt.format(a):>22s}{fmt.format(b):>24s}")

    lines.append(f"{'layout (cheapest that fits)':38s}{_layout(ep):>22s}{_layout(full):>24s}")
    row("per-GPU memory, GiB: total", lambda p: p.memory.total / GIB)
    row("  weights (bf16)", lambda p: p.memory.weights / GIB)
    row("  gradients (fp32 main_grad)", lambda p: p.memory.gradients / GIB)
    row("  optimizer states (fp32 Adam)", lambda p: p.memory.optimizer / GIB)
    row("  activations", lambda p: p.memory.activations.total / GIB)
    row("    one layer, one micro-batch", lambda p: p.memory.activations.per_layer / GIB, "{:.3f}")
    row("    embedding/logits/loss", lambda p: p.memory.activations.outside_layers / GIB)
    if s.recompute == "full":
        row("    recomputed layer (backward)",
            lambda p: p.memory.activations.recompute_buffer / GIB)
    row("  logits transient (bf16 copy)", lambda p: p.memory.logits_transient / GIB)
    row("  [Megatron formula, selective]", lambda p: p.megatron_activation_bytes / GIB)
    row("global batch, sequences", lambda p: p.global_batch, "{:,}")
    row("tokens / step (planned)", lambda p: p.global_batch * p.seq_length, "{:,}")
    row("model FLOPs / step, PFLOP", lambda p: p.step_model_flops / 1e15, "{:.1f}")
    row("model FLOPs / token, GFLOP",
        lambda p: p.step_model_flops / (p.global_batch * p.seq_length) / 1e9, "{:.1f}")
    row("step time, s", lambda p: p.step_seconds, "{:.2f}")
    row("tokens/s (cluster)", lambda p: p.tokens_per_second, "{:,.0f}")
    row(f"GPU-hours for {s.tokens:.3g} tokens", lambda p: p.gpu_hours, "{:,.1f}")
    same = plans["full_same_layout"]
    lines.append(f"{'full-length on EndPrompt layout, GiB':38s}{'':>22s}"
                 f"{same.memory.total / GIB:>17.2f}{'' if same.fits else ' (OOM)':>7s}")
    lines.append(f"{'  of which activations + logits':38s}"
                 f"{(ep.memory.activations.total + ep.memory.logits_transient) / GIB:>22.2f}"
                 f"{(same.memory.activations.total + same.memory.logits_transient) / GIB:>24.2f}")
    lines.append(f"{'memory ratio, same layout':38s}{ep.memory.total / same.memory.total:>22.3f}")
    lines.append(f"{'GPU-hour ratio EndPrompt / full':38s}{ep.gpu_hours / full.gpu_hours:>22.3f}")
    return "\n".join(lines)


def _step_tokens(s: PlanSettings, ep, full) -> str:
    """Tokens per step as planned: whole sequences, a multiple of DP x micro-batch, so a
    ``--global-batch-tokens`` that is not a multiple is rounded; say so instead of echoing it."""
    planned = [p.global_batch * p.seq_length for p in (ep, full)]
    if planned == [s.global_batch_tokens] * 2:
        return f"{s.global_batch_tokens:,} tokens/step"
    return (f"{s.global_batch_tokens:,} tokens/step requested, planned {planned[0]:,} "
            f"(EndPrompt) / {planned[1]:,} (full-length) as whole sequences, a multiple of DP x "
            "micro-batch")


def eval_text(s: PlanSettings, e: EvalCost) -> str:
    """The evaluation-at-L lines (see :mod:`.eval_cost` for the formulas)."""
    lines = [
        f"evaluation at L={e.length} ({e.tasks} tasks x {e.samples_per_task} samples, e.g. "
        f"RULER; prefill only, answers' decoding not counted, MFU {100 * s.mfu:g}%):",
        f"  prefill FLOPs / sample: {e.prefill_flops / 1e15:.2f} PFLOP, of which causal "
        f"attention (quadratic in L) {e.attention_flops / 1e15:.2f} PFLOP "
        f"({100 * e.attention_flops / e.prefill_flops:.0f}%)",
        f"  GPU time: {e.gpu_seconds:,.0f} GPU-s = {e.gpu_seconds / 3600:.2f} GPU-h for "
        f"{e.samples:,} samples ({e.gpu_seconds / 3600 / s.gpus:.2f} h on {s.gpus} "
        f"{s.gpu.name})",
        f"  memory / sample (batch 1, bf16): weights {e.weights_bytes / GIB:.1f} GiB + KV "
        f"cache {e.kv_cache_bytes / GIB:.1f} GiB + largest layer activation "
        f"{e.activation_bytes / GIB:.1f} GiB + fp32 logits at every position "
        f"{e.logits_bytes / GIB:.1f} GiB (scoring; generate keeps one) = "
        f"{e.memory_bytes / GIB:.1f} GiB: {e.gpus_for_memory(s.usable_bytes)} x "
        f"{s.gpu.name} (split with CP/TP)",
    ]
    return "\n".join(lines)


def sweep_table(rows: list[dict]) -> str:
    lines = [f"{'L':>8s}  {'full: cheapest layout':24s}{'GiB':>7s}{'GPU-h':>9s}"
             f"{'full on EP layout GiB':>23s}{'EndPrompt GiB':>15s}{'GPU-h':>9s}"]
    for r in rows:
        f, e, same = r["full"], r["endprompt"], r["full_same_layout"]
        lines.append(f"{r['target_length']:>8d}  {_layout(f):24s}{f.memory.total / GIB:>7.1f}"
                     f"{f.gpu_hours:>9,.1f}{same.memory.total / GIB:>23.1f}"
                     f"{e.memory.total / GIB:>15.1f}{e.gpu_hours:>9,.1f}")
    return "\n".join(lines)


def write_plot(path: str, s: PlanSettings, rows: list[dict]) -> None:
    """Per-GPU memory and GPU-hours against ``L`` for both methods (PNG/PDF/SVG by suffix).
    Written to a temporary file and renamed, so a failure leaves any previous plot intact."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    L = [r["target_length"] // 1024 for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ep_layout = rows[0]["endprompt"].layout
    for key, label, style in (("full_same_layout", "full-length at L", "o-"),
                              ("endprompt", f"EndPrompt at P={s.seq_length}", "s--")):
        mem = [r[key].memory.total / GIB for r in rows]
        ax1.plot(L, mem, style, label=label)
    for x, r in zip(L, rows):  # what full-length training needs instead
        lay, y = r["full"].layout, r["full_same_layout"].memory.total / GIB
        ax1.annotate(f"needs TP{lay.tp}/PP{lay.pp}/CP{lay.cp}", (x, y), fontsize=7,
                     textcoords="offset points", xytext=(0, 6), ha="center")
    for key, label, style in (("full", "full-length at L (cheapest fitting layout)", "o-"),
                              ("endprompt", f"EndPrompt at P={s.seq_length}", "s--")):
        ax2.plot(L, [r[key].gpu_hours for r in rows], style, label=label)
    ax1.axhline(s.usable_bytes / GIB, color="grey", lw=0.8, ls=":", label="usable memory")
    top = max(max(r[k].memory.total for r in rows for k in ("full_same_layout", "endprompt")),
              s.usable_bytes) / GIB
    ax1.set_ylim(0, top * 1.15)  # room for the layout labels
    ax1.set_xlim(L[0] - 0.08 * (L[-1] - L[0] or 1), L[-1] + 0.08 * (L[-1] - L[0] or 1))
    ax2.set_ylim(bottom=0)
    ax1.set(xlabel="target length L (K tokens)", ylabel="peak memory per GPU (GiB)",
            title=f"memory on EndPrompt's layout (TP{ep_layout.tp}/PP{ep_layout.pp}/"
                  f"CP{ep_layout.cp})")
    ax2.set(xlabel="target length L (K tokens)", ylabel="GPU-hours",
            title=f"GPU-hours for {s.tokens:.3g} tokens (MFU {100 * s.mfu:g}%)")
    for ax in (ax1, ax2):
        ax.set_xticks(L)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{s.model.name} on {s.gpus} x {s.gpu.name}, recompute {s.recompute}")
    fig.tight_layout()
    fmt = (os.path.splitext(path)[1] or ".png")[1:]
    try:
        with atomic_path(path) as tmp:  # the temporary has no suffix: name the format
            fig.savefig(tmp, dpi=120, format=fmt)
    finally:
        plt.close(fig)
