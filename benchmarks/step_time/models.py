"""Model set-up of step_time/bench.py: the single-process Megatron world, the Llama-style
config and layer spec (local on CPU, Transformer Engine on CUDA), stock / A-A / EndPrompt models
with shared weights, and EndPrompt batches."""

from __future__ import annotations

import argparse
import contextlib
import os

import torch

from megatron_endprompt.launch import free_port

# -- set-up ---------------------------------------------------------------------------------
def te_available() -> bool:
    try:
        import transformer_engine  # noqa: F401
        import transformer_engine.pytorch  # noqa: F401
    except Exception:
        return False
    return True


def add_model_args(p: argparse.ArgumentParser, *, hidden: int, layers: int, vocab: int,
                   seq_length: int, ratio: int) -> None:
    """The model-shape flags both step-time benchmarks take (defaults differ per benchmark)."""
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda when torch.cuda.is_available() and TE imports, else cpu")
    p.add_argument("--hidden", type=int, default=hidden)
    p.add_argument("--layers", type=int, default=layers)
    p.add_argument("--heads", type=int, default=None, help="default hidden/64")
    p.add_argument("--groups", type=int, default=None, help="query groups, default heads/4 (>=1)")
    p.add_argument("--ffn", type=int, default=None, help="default 8/3*hidden rounded up to 256")
    p.add_argument("--vocab", type=int, default=vocab)
    p.add_argument("--tie-embeddings", action="store_true", help="share input/output embedding")
    p.add_argument("--seq-length", type=int, default=seq_length, help="physical length P")
    p.add_argument("--ratio", type=int, default=ratio, help="L = ratio * P")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    p.add_argument("--seed", type=int, default=1234)


def resolve_model_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fill the derived shape defaults and resolve ``--device auto``; ``p.error`` for a CUDA
    request the machine cannot serve (no GPU or no Transformer Engine)."""
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() and te_available() else "cpu"
    if args.device == "cuda" and not (torch.cuda.is_available() and te_available()):
        p.error("--device cuda needs a CUDA GPU and Transformer Engine (the TE layer spec)")
    args.heads = args.heads or max(1, args.hidden // 64)
    args.groups = args.groups or max(1, args.heads // 4)
    args.ffn = args.ffn or -(-(8 * args.hidden // 3) // 256) * 256


def setup_process(args: argparse.Namespace) -> None:
    """Quiet Megatron's import noise, set torch's thread counts, and start the single-rank
    process group both benchmarks measure in."""
    from megatron_endprompt import runtime

    runtime.quiet()
    if args.threads:
        torch.set_num_threads(args.threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    init_parallel(args.device, args.seed)


def init_parallel(device: str, seed: int) -> None:
    """torch.distributed world size 1 + Megatron model parallel TP=PP=CP=1."""
    from megatron.core import parallel_state, tensor_parallel

    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        backend = "nccl" if device == "cuda" else "gloo"
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group(backend, rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    from megatron_endprompt import runtime

    if device == "cuda":
        runtime.install(cpu=False)  # wheel fixes + the TE fused-RoPE router for mixed layouts
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
    else:
        # The two CUDA calls the local-spec forward makes, for the rest of the process (as
        # tests/model/conftest.py does): the runtime's scoped CPU forward, never exited.
        _PROCESS_SCOPE.enter_context(runtime.cpu_forward())


#: Scoped runtime patches held for the benchmark process's lifetime.
_PROCESS_SCOPE = contextlib.ExitStack()


def model_config(args: argparse.Namespace):
    from megatron.core.transformer.transformer_config import TransformerConfig

    on_gpu = args.device == "cuda"
    return TransformerConfig(
        num_layers=args.layers,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        num_query_groups=args.groups,
        ffn_hidden_size=args.ffn,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=0.02,
        use_cpu_initialization=not on_gpu,
        bf16=on_gpu,
        params_dtype=torch.bfloat16 if on_gpu else torch.float32,
        apply_rope_fusion=on_gpu,
        # Megatron's bias-SwiGLU / bias-dropout fusions go through torch.compile; without biases
        # and dropout they save little, so the GPU run stays free of compile steps.
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,  # TE attention does its own softmax
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,  # needs DDP's main_grad buffers
        **(dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
           if getattr(args, "recompute", False) else {}),
    )


def layer_spec(args: argparse.Namespace):
    from megatron.core.models.gpt import gpt_layer_specs

    if args.device == "cuda":
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec()
    return gpt_layer_specs.get_gpt_layer_local_spec(normalization="RMSNorm")


def build_models(args: argparse.Namespace):
    """Stock ``GPTModel`` and ``EndPromptGPTModel`` with identical weights."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    from megatron_endprompt.model import EndPromptGPTModel

    config = model_config(args)
    common = dict(
        config=config,
        transformer_layer_spec=layer_spec(args),
        vocab_size=args.vocab,
        max_sequence_length=args.ratio * args.seq_length,
        position_embedding_type="rope",
        rotary_base=500000,
        share_embeddings_and_output_weights=args.tie_embeddings,
    )
    torch.manual_seed(args.seed)
    stock = GPTModel(**common)
    torch.manual_seed(args.seed)
    ours = EndPromptGPTModel(**common, pi_factor=float(args.ratio))
    ours.load_state_dict(stock.state_dict(), strict=True)
    if args.device == "cuda":
        stock.cuda()
        ours.cuda()
    return stock.train(), ours.train()


# -- batches --------------------------------------------------------------------------------
def endprompt_row(a: int, physical: int, target: int) -> torch.Tensor:
    """Context ``0..a-1`` then terminal ``target-b..target-1``, ``b = physical - a``."""
    b = physical - a
    return torch.cat((torch.arange(a), torch.arange(target - b, target)))


def make_batch(kind: str, args: argparse.Namespace, seq: int, gen: torch.Generator,
               batch: int | None = None) -> dict:
    """``kind``: ``contiguous`` (0..seq-1), ``shared`` (one EndPrompt layout for all rows) or
    ``mixed`` (a random layout per row). Returns forward kwargs on ``args.device``."""
    batch = batch or args.micro_batch
    target = args.ratio * args.seq_length
    tokens = torch.randint(0, args.vocab, (batch, seq + 1), generator=gen)
    if kind == "contiguous":
        pos = torch.arange(seq)[None].expand(batch, seq)
    elif kind == "shared":
        pos = endprompt_row(seq * 3 // 4, seq, target)[None].expand(batch, seq)
    elif kind == "mixed":
        lo, hi = seq // 4, seq - seq // 8
        rows = [int(torch.randint(lo, hi, (1,), generator=gen)) for _ in range(batch)]
        if batch > 1 and len(set(rows)) == 1:
            rows[-1] = rows[0] - 1
        pos = torch.stack([endprompt_row(a, seq, target) for a in rows])
    else:
        raise ValueError(kind)
    out = dict(
        input_ids=tokens[:, :-1].contiguous(),
        labels=tokens[:, 1:].contiguous(),
        position_ids=pos.contiguous(),
        attention_mask=None,
    )
    if args.device == "cpu":  # local spec: Megatron builds its default causal mask on "cuda"
        out["attention_mask"] = torch.triu(torch.ones(1, 1, seq, seq, dtype=torch.bool), 1)
    if args.device == "cuda":
        out = {k: (v.cuda(non_blocking=True) if v is not None else None) for k, v in out.items()}
    return out
