"""Measurement helpers of step_time/bench.py: timing (interleaved rounds, paired ratios),
activation / parameter / CUDA peak memory, FLOPs, per-call RoPE costs and op profiles."""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time

import torch

# -- measurement ----------------------------------------------------------------------------
def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def step(model: torch.nn.Module, batch: dict) -> None:
    loss = model(
        batch["input_ids"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"]
    )
    loss.float().mean().backward()


def timed_step(model: torch.nn.Module, batch: dict, device: str) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one step."""
    sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
    step(model, batch)
    sync(device)
    return time.perf_counter() - t0, time.process_time() - c0


def interleaved(runs: dict, iters: int, warmup: int, device: str, repeats: dict | None = None):
    """``runs``: name -> (model, batch). Warm-up, then ``iters`` rounds each running every
    variant once (``repeats[name]`` times back to back, the round's median kept), the order
    rotated by one every round. Returns (name -> wall step times, name -> process CPU times),
    seconds, one per round."""
    repeats = repeats or {}
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            step(*runs[name])
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    gc.collect()
    gc.disable()
    try:
        for i in range(iters):
            k = i % len(names)
            for name in names[k:] + names[:k]:
                got = [timed_step(*runs[name], device) for _ in range(repeats.get(name, 1))]
                times[name].append(statistics.median(w for w, _ in got))
                cpu[name].append(statistics.median(c for _, c in got))
    finally:
        gc.enable()
    return times, cpu


def activation_bytes(model: torch.nn.Module, batch: dict) -> int:
    """Bytes of the distinct storages autograd saves for backward in one forward, parameters
    excluded (= activation memory at the forward/backward boundary). Runs backward too, to
    free the graph the same way a step does."""
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            try:
                st = t.untyped_storage()
            except (RuntimeError, NotImplementedError):
                return t
            ptr = st.data_ptr()
            if ptr and ptr not in param_ptrs:
                seen[ptr] = max(seen.get(ptr, 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step(model, batch)
    return sum(seen.values())


def param_grad_bytes(model: torch.nn.Module) -> int:
    return sum(2 * p.numel() * p.element_size() for p in model.parameters())


def resident_bytes(model: torch.nn.Module) -> int:
    """Bytes of ``model``'s parameters and allocated gradients."""
    return sum(p.numel() * p.element_size() + (0 if p.grad is None else p.grad.nbytes)
               for p in model.parameters())


def cuda_peak_bytes(model: torch.nn.Module, batch: dict, others: tuple = ()) -> int | None:
    """``torch.cuda.max_memory_allocated`` over one step of ``model``, less the parameters and
    gradients of the ``others`` models that are resident only because this benchmark keeps
    both models on the GPU (so the figure is one model's training peak, optimizer excluded)."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    step(model, batch)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - sum(resident_bytes(m) for m in others)


def train_flops(args: argparse.Namespace, seq: int) -> float:
    """Model training FLOPs of one sample of length ``seq`` (3 x forward), as Megatron's
    ``num_floating_point_operations`` counts a dense GQA/SwiGLU transformer (causal core
    attention counted half)."""
    h, kvc = args.hidden, args.hidden // args.heads
    q, kv = args.heads * kvc, args.groups * kvc
    per_layer = 4 * seq * h * (q + kv) + 2 * seq * seq * q + 6 * seq * h * args.ffn
    return 3.0 * (args.layers * per_layer + 2 * seq * h * args.vocab)


def per_call_seconds(fn, device: str, number: int = 200, repeat: int = 5) -> float:
    """Best-of-``repeat`` mean seconds per call of ``fn`` (synchronised on CUDA)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        sync(device)
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def rope_path_costs(runs: dict, device: str) -> dict:
    """Noise-robust view of what EndPrompt adds per step: the RoPE module call and the whole
    ``_preprocess`` (embedding + RoPE) of each variant, microseconds. Stock's freqs come from
    its ``lru_cache``; ours are built from ``position_ids`` every call."""
    from megatron_endprompt.model import EndPromptRotaryEmbedding

    out: dict[str, dict] = {}
    with torch.no_grad():
        for name, (model, batch) in runs.items():
            ids, pos = batch["input_ids"], batch["position_ids"]
            if isinstance(model.rotary_pos_emb, EndPromptRotaryEmbedding):
                rope = lambda m=model, p=pos: m.rotary_pos_emb(p)  # noqa: E731

                def pre(m=model, i=ids, p=pos):  # positions handed as EndPromptPositions does
                    with m.rotary_pos_emb.call_positions(p):
                        return m._preprocess(i, p)
            else:  # stock: forward(max_seq_len), lru_cache-d
                rope = lambda m=model, n=ids.shape[1]: m.rotary_pos_emb(n)  # noqa: E731
                pre = lambda m=model, i=ids, p=pos: m._preprocess(i, p)  # noqa: E731
            out[name] = dict(rope_call_us=1e6 * per_call_seconds(rope, device),
                             preprocess_us=1e6 * per_call_seconds(pre, device, number=50))
    return out


def op_profile(model: torch.nn.Module, batch: dict) -> dict:
    """One step under a dispatch mode counting aten ops (forward + backward) and torch's
    ``FlopCounterMode`` (aten matmul-type FLOPs; TE's own GEMMs are invisible to it)."""
    import collections

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    class CountOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: collections.Counter = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func)] += 1
            return func(*args, **(kwargs or {}))

    flops, count = FlopCounterMode(display=False), CountOps()
    with flops, count:
        step(model, batch)
    return dict(aten_ops=sum(count.ops.values()), flops=flops.get_total_flops(), ops=count.ops)


def summarize(times: list[float]) -> dict:
    qs = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return dict(median_s=statistics.median(times), q1_s=qs[0], q3_s=qs[2],
                min_s=min(times), n=len(times))


def paired(a: list[float], b: list[float]) -> dict:
    r = [x / y for x, y in zip(a, b)]
    qs = statistics.quantiles(r, n=4) if len(r) >= 2 else [r[0]] * 3
    return dict(ratio_of_medians=statistics.median(a) / statistics.median(b),
                ratio_of_mins=min(a) / min(b), paired_median=statistics.median(r),
                paired_q1=qs[0], paired_q3=qs[2])


# -- main -----------------------------------------------------------------------------------
def write_json(path: str, result: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
