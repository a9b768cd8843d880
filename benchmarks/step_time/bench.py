"""Training-step benchmark: EndPrompt RoPE overhead; EndPrompt at P vs full-length training at L.

One small Llama-style Megatron-Core model (RMSNorm, SwiGLU, GQA, RoPE, no biases, output layer
untied unless ``--tie-embeddings``), built in-process on a single rank (gloo on CPU, NCCL on CUDA,
TP=PP=CP=1):

* CPU: Megatron's local layer spec (``get_gpt_layer_local_spec``), fp32, unfused kernels, an
  explicit causal mask (local ``DotProductAttention`` materialises the ``S x S`` scores);
* CUDA with Transformer Engine (``--device cuda``, or ``auto`` when ``torch.cuda.is_available()``
  and TE imports): the TE layer spec, bf16 parameters, TE fused RoPE (``apply_rope_fusion``) and
  TE's flash/fused causal attention (no mask tensor); Megatron's torch.compile'd bias-SwiGLU
  fusion off.

A *step* is forward with ``labels`` (Megatron's own loss path -> per-token loss ``[B, S]``),
``loss.mean().backward()``; gradients stay allocated (accumulated, as with persistent grad
buffers); no optimizer step. It is timed with ``time.perf_counter`` (``torch.cuda.synchronize``
before and after on CUDA) with the garbage collector off; torch intra-op threads are fixed
(``--threads``, default all cores; use 1 on a small machine shared with other jobs, where
several threads make step times swing by 2-10x) and inter-op threads set to 1.

Part 1 -- RoPE overhead at the same physical length ``P`` (target <= 1.02x).
    ``stock``: ``GPTModel`` with its stock ``RotaryEmbedding`` (contiguous positions; its freqs are
    ``lru_cache``-d). ``shared``: ``EndPromptGPTModel`` (same weights, copied by ``state_dict``),
    every row with the same EndPrompt layout -- context ``0..a-1`` then terminal ``L-b..L-1``
    with ``a + b = P``, ``L = ratio * P`` -> freqs ``[S, 1, 1, D]``. ``mixed``: the same model,
    each row its own random ``a`` -> freqs ``[S, B, 1, D]`` (needs ``--micro-batch >= 2``; on
    CUDA it takes Megatron's unfused RoPE kernel, see ``megatron_endprompt.runtime.rope``).
    ``stock_copy`` (A/A control, ``--no-aa-control`` drops it): a second stock instance with the
    same weights and batch -- its ratio to ``stock`` is the noise floor of the measurement.
    After ``--warmup`` untimed steps of each, ``--iters`` rounds run each variant once, in an
    order rotated every round (A B C D, B C D A, ...) so that drift and order effects cancel.
    Reported: per-variant median step time, the ratio of medians, the median (and
    interquartile range) of the per-round paired ratios ``variant / stock``, the ratio of the
    minima, and the same ratio on process CPU time (less disturbed than wall-clock time by other
    jobs on the cores, with one torch thread). Noise-free companions: the aten ops of one step
    (counted under a dispatch mode, CPU only; extra ops vs stock listed) with the matmul FLOPs of
    torch's ``FlopCounterMode``, and the microseconds of each variant's RoPE call and
    ``_preprocess`` (best of 5 x 200/50 calls) as a fraction of a stock step.

Part 2 -- EndPrompt at ``P`` vs full-length training at ``L = ratio * P``, same model and
micro-batch (``--long-micro-batch``, default ``--micro-batch``). "full" is the stock ``GPTModel`` at
``L`` with positions ``0..L-1`` (what one would train without EndPrompt); "endprompt" is the
shared-layout EndPrompt run at ``P`` (timings reuse Part 1's when the micro-batches agree;
``--iters-long`` interleaved rounds, each one full step and ``ratio`` endprompt steps (their median
kept), give the paired ratio).
    * time ideal: the model-FLOP ratio ``F(P) / F(L)`` per sample, ``F`` the training FLOPs of
      :func:`train_flops` (Megatron's ``num_floating_point_operations`` for a dense GQA/SwiGLU
      model: 3 x forward; forward = QKV/out projections ``4 S h (q + kv)``, causal core attention
      ``2 S^2 q``, SwiGLU MLP ``6 S h f``, logits ``2 S h V`` per sample,
      ``q = heads * kv_channels``, ``kv = groups * kv_channels``). Linear terms give ``1/ratio``,
      attention ``1/ratio^2``; the ideal lies between, by the model's own mix.
    * memory ideal: activations ``1/ratio`` (activation memory linear in ``S``, true with flash
      attention; the CPU local spec also stores ``S x S`` attention probabilities, so its measured
      activation ratio can beat ``1/ratio``). For total memory the ideal is
      ``(W + A_L / ratio) / (W + A_L)``, ``W`` = parameter + gradient bytes, ``A_L`` = activations
      measured at ``L``.
    * activation memory (CPU and CUDA): one extra, untimed forward under
      ``torch.autograd.graph.saved_tensors_hooks`` summing the bytes of the distinct storages
      saved for backward (parameters excluded) -- the activations held at the forward/backward
      boundary, which is where training peaks (transient kernel workspace not included).
      Parameter + gradient bytes are added for the CPU "peak" figure. On CUDA the peak is also
      measured directly: ``torch.cuda.max_memory_allocated`` over one step after
      ``reset_peak_memory_stats``, less the other models' parameters and gradients (all models
      stay on the GPU). No optimizer: its state is the same at P and L.

On CUDA it also prints tokens/s and MFU = tokens/s x (``F(S)/S``) / peak, peak = ``--peak-tflops``
(989 TFLOP/s: H200 dense bf16).

    .venv/bin/python -m benchmarks.step_time.bench --device cpu --threads 1 --hidden 256 \\
        --layers 4 --seq-length 512 --ratio 8 --micro-batch 2 --long-micro-batch 1 \\
        --iters 30 --warmup 3 --iters-long 3

(about 3 minutes on 2 cores); ``benchmarks/gpu_check.sh`` runs the GPU configuration.

Writes ``--out`` (JSON, default ``benchmarks/out/step_time.json``) and prints a summary.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

from benchmarks.paths import OUT
from benchmarks.step_time.measure import (
    activation_bytes, cuda_peak_bytes, interleaved, op_profile, paired, param_grad_bytes,
    rope_path_costs, summarize, train_flops, write_json,
)
from benchmarks.step_time.models import (
    add_model_args,
    build_models,
    make_batch,
    resolve_model_args,
    setup_process,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, hidden=256, layers=4, vocab=8192, seq_length=512, ratio=8)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--long-micro-batch", type=int, default=None,
                   help="micro-batch of part 2 (P vs L), both sides; default --micro-batch")
    p.add_argument("--iters", type=int, default=30, help="interleaved rounds at P (part 1)")
    p.add_argument("--iters-long", type=int, default=3, help="interleaved rounds P vs L (part 2)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="for MFU (H200 bf16 dense)")
    p.add_argument("--no-aa-control", dest="aa_control", action="store_false",
                   help="skip the A/A control (a second stock instance timed like the others)")
    p.add_argument("--skip-long", action="store_true", help="skip part 2 (the L run)")
    p.add_argument("--recompute", action="store_true",
                   help="full activation recompute of every layer (both P and L), so a ~1B "
                        "model's full-length step at L=65536 fits one GPU")
    p.add_argument("--out", default=os.path.join(OUT, "step_time.json"))
    args = p.parse_args(argv)
    resolve_model_args(p, args)
    if args.recompute and args.device != "cuda":
        p.error("--recompute needs CUDA (Megatron's checkpointing saves CUDA RNG states)")
    args.long_micro_batch = args.long_micro_batch or args.micro_batch
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_process(args)
    stock, ours = build_models(args)
    dev = args.device
    P, L = args.seq_length, args.ratio * args.seq_length
    B, BL = args.micro_batch, args.long_micro_batch
    n_params = sum(p.numel() for p in stock.parameters())
    print(f"device={dev} ({'TE spec, bf16' if dev == 'cuda' else 'local spec, fp32'}) "
          f"threads={torch.get_num_threads()} params={n_params / 1e6:.1f}M h={args.hidden} "
          f"layers={args.layers} heads={args.heads}/{args.groups} ffn={args.ffn} "
          f"vocab={args.vocab} P={P} L={L} B={B} (part 2: B={BL})", flush=True)

    gen = torch.Generator().manual_seed(args.seed)
    runs = {"stock": (stock, make_batch("contiguous", args, P, gen))}
    models = [stock, ours]
    if args.aa_control:  # a second stock instance, same weights and batch: the noise floor
        stock_copy = build_models(args)[0]
        stock_copy.load_state_dict(stock.state_dict(), strict=True)
        runs["stock_copy"] = (stock_copy, runs["stock"][1])
        models.append(stock_copy)
    runs["shared"] = (ours, make_batch("shared", args, P, gen))
    if B >= 2:
        runs["mixed"] = (ours, make_batch("mixed", args, P, gen))

    def others(model):
        return tuple(m for m in models if m is not model)
    # The layouts really are what we claim: [S, 1, 1, D] shared, [S, B, 1, D] mixed.
    freq_shapes = {k: list(ours.rotary_pos_emb(runs[k][1]["position_ids"]).shape)
                   for k in ("shared", "mixed") if k in runs}
    t0 = time.perf_counter()
    times, cpu = interleaved(runs, args.iters, args.warmup, dev)
    wall1 = time.perf_counter() - t0
    costs = rope_path_costs(runs, dev)
    # Op counting on CPU only: it is device-independent Python-level dispatch, and TE's kernels
    # are not aten ops anyway.
    profiles = {k: op_profile(*v) for k, v in runs.items()} if dev == "cpu" else {}
    op_diff = {k: dict(aten_ops=p["aten_ops"], flops=p["flops"],
                       extra_ops_vs_stock=dict(p["ops"] - profiles["stock"]["ops"]),
                       missing_ops_vs_stock=dict(profiles["stock"]["ops"] - p["ops"]))
               for k, p in profiles.items()}
    part1 = {
        "freqs_shapes": freq_shapes,
        "times": {k: summarize(v) for k, v in times.items()},
        "vs_stock": {k: paired(times[k], times["stock"]) for k in runs if k != "stock"},
        "cpu_times": {k: summarize(v) for k, v in cpu.items()},
        "cpu_vs_stock": {k: paired(cpu[k], cpu["stock"]) for k in runs if k != "stock"},
        "target": 1.02,
        "wall_s": wall1,
        "path_costs_us": costs,
        "op_profile": op_diff,
    }
    stock_med = part1["times"]["stock"]["median_s"]
    for k in runs:
        if k != "stock":
            extra_us = costs[k]["preprocess_us"] - costs["stock"]["preprocess_us"]
            costs[k]["extra_preprocess_fraction_of_step"] = extra_us * 1e-6 / stock_med
    print(f"\n[1] step time at P={P}, B={B}: {args.iters} interleaved rounds, median "
          f"({part1['wall_s']:.0f}s)")
    for k, s in part1["times"].items():
        extra = ""
        if k != "stock":
            v, c = part1["vs_stock"][k], part1["cpu_vs_stock"][k]
            extra = (f"  vs stock {v['ratio_of_medians']:.4f}x (paired median "
                     f"{v['paired_median']:.4f}x, IQR {v['paired_q1']:.4f}-{v['paired_q3']:.4f};"
                     f" min {v['ratio_of_mins']:.4f}x; CPU time {c['ratio_of_medians']:.4f}x)")
        print(f"    {k:10s} {s['median_s'] * 1e3:9.2f} ms  (IQR {s['q1_s'] * 1e3:.2f}-"
              f"{s['q3_s'] * 1e3:.2f}){extra}")
    for k, d in op_diff.items():
        extra = sum(d["extra_ops_vs_stock"].values())
        print(f"    {k:10s} aten ops/step {d['aten_ops']:6d} (+{extra} vs stock: "
              f"{', '.join(o.replace('aten.', '') for o in sorted(d['extra_ops_vs_stock'])) or '-'}"
              f"), counted FLOPs {d['flops'] / 1e9:.2f} G")
    for k, c in costs.items():
        frac = c.get("extra_preprocess_fraction_of_step")
        print(f"    {k:10s} RoPE call {c['rope_call_us']:8.1f} us, "
              f"_preprocess {c['preprocess_us']:8.1f}"
              f" us" + ("" if frac is None else f" (+{100 * frac:.3f}% of a stock step)"))

    result = dict(
        benchmark="step_time",
        config=dict(vars(args), params=n_params, P=P, L=L, B=B, threads=torch.get_num_threads(),
                    spec="transformer_engine" if dev == "cuda" else "local",
                    dtype="bf16" if dev == "cuda" else "fp32"),
        machine=dict(platform=platform.platform(), cpu_count=os.cpu_count(),
                     python=sys.version.split()[0], torch=torch.__version__,
                     cuda=torch.cuda.get_device_name() if dev == "cuda" else None),
        part1_rope_overhead=part1,
    )
    gib = 2 ** 30
    write_json(args.out, result)  # part 1 survives a failure (e.g. OOM at L) in part 2

    if not args.skip_long:
        try:
            ep_run = runs["shared"] if BL == B else (ours, make_batch("shared", args, P, gen, BL))
            long_run = (stock, make_batch("contiguous", args, L, gen, BL))
            t0 = time.perf_counter()
            lt, lc = interleaved({"full_L": long_run, "endprompt_P": ep_run}, args.iters_long, 1,
                                 dev, repeats={"endprompt_P": args.ratio})
            long_wall = time.perf_counter() - t0
            mem = {name: dict(activation_bytes=activation_bytes(*run),
                              cuda_peak_bytes=cuda_peak_bytes(*run, others=others(run[0]))
                              if dev == "cuda" else None)
                   for name, run in (("endprompt_P", ep_run), ("full_L", long_run))}
            W = param_grad_bytes(stock)
            flops_p, flops_l = train_flops(args, P), train_flops(args, L)
            a_p, a_l = mem["endprompt_P"]["activation_bytes"], mem["full_L"]["activation_bytes"]
            ep_times = lt["endprompt_P"] + (times["shared"] if BL == B else [])
            ep_time, full_time = statistics.median(ep_times), statistics.median(lt["full_L"])
            part2 = dict(
                micro_batch=BL,
                full_L=summarize(lt["full_L"]),
                endprompt_P=summarize(ep_times),
                time_ratio=ep_time / full_time,
                time_ratio_paired=paired(lt["endprompt_P"], lt["full_L"]),
                time_ratio_cpu=paired(lc["endprompt_P"], lc["full_L"]),
                time_ideal_flop_ratio=flops_p / flops_l,
                time_bounds=dict(linear_only=1 / args.ratio, attention_only=1 / args.ratio ** 2),
                train_flops_per_sample=dict(P=flops_p, L=flops_l),
                param_grad_bytes=W,
                activation_bytes=dict(P=a_p, L=a_l),
                activation_ratio=a_p / a_l,
                activation_ideal=1 / args.ratio,
                peak_bytes_model=dict(P=W + a_p, L=W + a_l),
                peak_ratio=(W + a_p) / (W + a_l),
                peak_ideal=(W + a_l / args.ratio) / (W + a_l),
                memory=mem,
                wall_s=long_wall,
            )
            print(f"\n[2] EndPrompt at P={P} vs full at L={L}, B={BL} "
                  f"(same model; {long_wall:.0f}s)")
            print(f"    step time   full {full_time:8.3f} s  endprompt {ep_time:8.4f} s  ratio "
                  f"{part2['time_ratio']:.4f} (speed-up {1 / part2['time_ratio']:.1f}x; CPU time "
                  f"{part2['time_ratio_cpu']['ratio_of_medians']:.4f}); ideal = FLOP ratio "
                  f"{part2['time_ideal_flop_ratio']:.4f} (speed-up "
                  f"{1 / part2['time_ideal_flop_ratio']:.1f}x; bounds 1/{args.ratio}, "
                  f"1/{args.ratio ** 2})")
            print(f"    activations full {a_l / gib:8.3f} GiB endprompt {a_p / gib:8.4f} GiB ratio "
                  f"{part2['activation_ratio']:.4f}; ideal 1/ratio = {1 / args.ratio:.4f}")
            print(f"    peak (W+A)  full {(W + a_l) / gib:8.3f} GiB "
                  f"endprompt {(W + a_p) / gib:8.4f} GiB "
                  f"ratio {part2['peak_ratio']:.4f}; ideal {part2['peak_ideal']:.4f} "
                  f"(params+grads W = {W / gib:.3f} GiB)")
            if dev == "cuda":
                cp, cl = mem["endprompt_P"]["cuda_peak_bytes"], mem["full_L"]["cuda_peak_bytes"]
                part2.update(cuda_peak_bytes=dict(P=cp, L=cl), cuda_peak_ratio=cp / cl)
                print(f"    cuda max_memory_allocated full {cl / gib:.2f} GiB endprompt "
                      f"{cp / gib:.2f} GiB ratio {cp / cl:.4f}")
            result["part2_P_vs_L"] = part2
        except torch.OutOfMemoryError as exc:  # report part 1 and the peak estimate anyway
            print(f"\n[2] out of memory at L={L}, B={BL}: {str(exc).splitlines()[0]}")
            result["part2_P_vs_L"] = dict(error="out of memory", micro_batch=BL)
            del exc
            torch.cuda.empty_cache()

    if dev == "cuda":
        thr = {}
        peak = args.peak_tflops * 1e12
        rows = [("endprompt_P", P, B, part1["times"]["shared"]["median_s"])]
        if "full_L" in result.get("part2_P_vs_L", {}):
            rows.append(("full_L", L, BL, result["part2_P_vs_L"]["full_L"]["median_s"]))
        print()
        for name, seq, batch, t in rows:
            tps = batch * seq / t
            flops_tok = train_flops(args, seq) / seq
            thr[name] = dict(tokens_per_s=tps, train_flops_per_token=flops_tok,
                             mfu=tps * flops_tok / peak, peak_tflops=args.peak_tflops)
            if name == "endprompt_P":
                thr[name]["cuda_peak_bytes"] = cuda_peak_bytes(*runs["shared"], others=others(ours))
            else:
                thr[name]["cuda_peak_bytes"] = result["part2_P_vs_L"]["cuda_peak_bytes"]["L"]
            print(f"    {name:12s} tokens/s {tps:12.0f}  MFU {100 * tps * flops_tok / peak:5.1f}% "
                  f"(model FLOPs/token {flops_tok / 1e9:.2f} G, peak {args.peak_tflops:g} "
                  f"TFLOP/s)  peak mem {thr[name]['cuda_peak_bytes'] / gib:.1f} GiB")
        result["gpu_throughput"] = thr

    write_json(args.out, result)
    print(f"\nwrote {args.out}")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
