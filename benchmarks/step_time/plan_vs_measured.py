"""The planner's memory prediction beside what one training step really holds.

Builds the model of ``benchmarks/step_time/bench.py`` (``step_time.models``: Llama-style
Megatron-Core GPT, one rank; CUDA: Transformer Engine spec, bf16, TE fused RoPE and flash/fused
attention; CPU: local spec, fp32, explicit causal mask) as an ``EndPromptGPTModel``, runs one
warm-up step (gradients allocated, as in steady-state training; no optimizer), then measures,
for EndPrompt at ``P`` (shared layout, ``--micro-batch``) and full-length at ``L = ratio x P``
(contiguous positions, ``--long-micro-batch``):

* saved-tensor bytes of one step (``step_time.measure.activation_bytes``:
  ``torch.autograd.graph.saved_tensors_hooks``, distinct storages, parameters excluded) vs the
  planner's activations (:class:`megatron_endprompt.planning.ActivationModel`, ``flash`` on
  CUDA -- with ``swiglu_fusion=False``, as the benchmark turns Megatron's fusion off -- and
  ``local`` on CPU);
* on CUDA, ``torch.cuda.max_memory_allocated`` over one step after ``reset_peak_memory_stats``
  vs the planner's peak: weights (bf16) + gradients (bf16 ``.grad``; no fp32 ``main_grad``, no
  optimizer here) + activations + the logits' bf16 transient.

    python -m benchmarks.step_time.plan_vs_measured --device cuda --hidden 2048 --layers 16 \\
        --heads 32 --groups 8 --ffn 8192 --vocab 128256 --tie-embeddings --seq-length 8192 \\
        --ratio 4

(``benchmarks/gpu_check.sh`` runs this; on CPU use tiny sizes, e.g. the defaults.) Writes
``--out`` (JSON) and prints one line per figure: predicted, measured, ratio.
"""

from __future__ import annotations

import argparse
import gc
import os

import torch

from benchmarks.paths import OUT
from benchmarks.step_time.measure import activation_bytes, step, write_json
from benchmarks.step_time.models import (
    add_model_args,
    build_models,
    make_batch,
    resolve_model_args,
    setup_process,
)

GIB = 2 ** 30


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p, hidden=128, layers=2, vocab=1024, seq_length=128, ratio=4)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--long-micro-batch", type=int, default=1)
    p.add_argument("--skip-long", action="store_true", help="measure P only")
    p.add_argument("--out", default=os.path.join(OUT, "plan_vs_measured.json"))
    args = p.parse_args(argv)
    resolve_model_args(p, args)
    return args


def prediction(args: argparse.Namespace, seq: int, micro_batch: int) -> dict:
    """The planner's figures for this single-rank benchmark model (bytes)."""
    from megatron_endprompt.planning import ActivationModel, ModelSpec

    cuda = args.device == "cuda"
    spec = ModelSpec(name="bench", num_layers=args.layers, hidden_size=args.hidden,
                     ffn_hidden_size=args.ffn, num_attention_heads=args.heads,
                     num_query_groups=args.groups, head_dim=args.hidden // args.heads,
                     vocab_size=args.vocab, tied=args.tie_embeddings)
    act = ActivationModel(model=spec, attention="flash" if cuda else "local",
                          bytes_per_value=2 if cuda else 4, swiglu_fusion=False)
    stage = act.stage(seq=seq, micro_batch=micro_batch, vocab=args.vocab)
    transient = act.logits_transient_bytes(seq=seq, micro_batch=micro_batch, vocab=args.vocab)
    return dict(activations=stage.total, logits_transient=transient,
                per_layer=stage.per_layer)


def measure(model: torch.nn.Module, batch: dict, device: str) -> dict:
    step(model, batch)  # warm-up: allocates .grad as steady-state training holds it
    out = dict(activations=activation_bytes(model, batch),
               params_grads=sum(p.numel() * p.element_size() + (p.grad.nbytes if p.grad
                                                                  is not None else 0)
                                for p in model.parameters()))
    if device == "cuda":
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        step(model, batch)
        torch.cuda.synchronize()
        out["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_process(args)
    stock, ours = build_models(args)
    del stock  # one model on the device: its peak is what a single rank of training holds
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    P, L = args.seq_length, args.ratio * args.seq_length
    gen = torch.Generator().manual_seed(args.seed)
    cases = [("endprompt_P", "shared", P, args.micro_batch)]
    if not args.skip_long:
        cases.append(("full_L", "contiguous", L, args.long_micro_batch))
    mode = "TE spec, bf16, flash attention" if args.device == "cuda" else "local spec, fp32"
    print(f"device={args.device} ({mode}) h={args.hidden} layers={args.layers} "
          f"heads={args.heads}/{args.groups} ffn={args.ffn} vocab={args.vocab} P={P} L={L}")
    result = dict(benchmark="plan_vs_measured", config=vars(args), cases={})
    for name, kind, seq, mb in cases:
        try:
            got = measure(ours, make_batch(kind, args, seq, gen, mb), args.device)
        except torch.OutOfMemoryError as exc:
            print(f"{name}: out of memory at S={seq}, B={mb}: {str(exc).splitlines()[0]}")
            result["cases"][name] = dict(error="out of memory")
            torch.cuda.empty_cache()
            continue
        pred = prediction(args, seq, mb)
        pred["peak"] = got["params_grads"] + pred["activations"] + pred["logits_transient"]
        rows = [("activations (saved tensors)", pred["activations"], got["activations"])]
        if "max_memory_allocated" in got:
            rows.append(("peak (max_memory_allocated)", pred["peak"], got["max_memory_allocated"]))
        print(f"{name} (S={seq}, B={mb}; params+grads {got['params_grads'] / GIB:.3f} GiB):")
        for label, p, m in rows:
            print(f"    {label:30s} predicted {p / GIB:9.3f} GiB  measured {m / GIB:9.3f} GiB"
                  f"  ratio {p / m:.3f}")
        result["cases"][name] = dict(seq=seq, micro_batch=mb, predicted=pred, measured=got,
                                     ratios={label: p / m for label, p, m in rows})
    write_json(args.out, result)
    print(f"wrote {args.out}")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
