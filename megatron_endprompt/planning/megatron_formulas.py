"""Megatron-LM's own accounting, called (not copied) with a built argument namespace.

* parameters on the most loaded model shard and the bytes of weights + gradients + optimizer
  states: ``megatron.training.theoretical_memory_usage.compute_weight_and_optimizer_memory``
  (bf16 parameters, fp32 main gradients, fp32 main parameters and Adam moments: 18 bytes per
  parameter, ``6 + 12 / DP`` with the distributed optimizer);
* Megatron's activation estimate for comparison:
  ``theoretical_memory_usage.compute_activation_memory`` (Korthikanti et al. 2022, Table 2:
  ``s b h (18 + 4 f / h)`` bytes per layer, which assumes selective recompute / flash attention
  and sequence parallelism, and ``q = h``; see :mod:`.activations` for ours);
* model training FLOPs: ``megatron.training.training.num_floating_point_operations`` (3 x
  forward; causal core attention counted half).

The namespace comes from Megatron's own argument parser (``add_megatron_arguments``), so every
field those functions read has Megatron's default; the parser is built once per process.
"""

from __future__ import annotations

import argparse
import copy
import functools
import math
import warnings

from megatron_endprompt import runtime
from megatron_endprompt.planning.presets import ModelSpec

__all__ = ["MegatronAccounting", "megatron_namespace", "padded_vocab_size"]

#: Megatron's ``--make-vocab-size-divisible-by`` default
VOCAB_DIVISOR = 128


def padded_vocab_size(vocab: int, tp: int) -> int:
    """Megatron's padding: the next multiple of ``128 * TP`` (``calculate_padded_vocab_size``)."""
    multiple = VOCAB_DIVISOR * tp
    return int(math.ceil(vocab / multiple) * multiple)


@functools.lru_cache(maxsize=1)
def _parser() -> argparse.ArgumentParser:
    runtime.quiet()
    with warnings.catch_warnings():  # "Apex is not installed..." import chatter
        warnings.simplefilter("ignore")
        from megatron.training.arguments import add_megatron_arguments

    return add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))


@functools.lru_cache(maxsize=16)
def _model_namespace(model: ModelSpec) -> argparse.Namespace:
    flags = [
        "--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
        "--ffn-hidden-size", str(model.ffn_hidden_size),
        "--num-attention-heads", str(model.num_attention_heads),
        "--kv-channels", str(model.head_dim), "--swiglu", "--normalization", "RMSNorm",
        "--disable-bias-linear", "--position-embedding-type", "rope", "--bf16",
        "--seq-length", "4096", "--max-position-embeddings", "4096", "--micro-batch-size", "1",
    ]
    if model.num_query_groups != model.num_attention_heads:
        flags += ["--group-query-attention", "--num-query-groups", str(model.num_query_groups)]
    if not model.tied:
        flags.append("--untie-embeddings-and-output-weights")
    flags += (["--add-qkv-bias"] if model.qkv_bias else []) + \
        (["--qk-layernorm"] if model.qk_norm else [])
    return _parser().parse_args(flags)


def megatron_namespace(model: ModelSpec, *, seq_length: int, micro_batch: int, tp: int, pp: int,
                       cp: int, dp: int, distributed_optimizer: bool = True,
                       recompute: str = "none") -> argparse.Namespace:
    """Megatron-LM ``args`` for ``model`` on a TP x PP x CP x DP layout (what ``validate_args``
    would derive: world size, padded vocabulary, sequence parallelism with TP > 1)."""
    ns = copy.copy(_model_namespace(model))
    ns.seq_length = seq_length
    ns.max_position_embeddings = max(seq_length, ns.max_position_embeddings)
    ns.micro_batch_size = micro_batch
    ns.tensor_model_parallel_size = tp
    ns.pipeline_model_parallel_size = pp
    ns.context_parallel_size = cp
    ns.data_parallel_size = dp
    ns.world_size = tp * pp * cp * dp
    ns.expert_tensor_parallel_size = tp
    ns.expert_model_parallel_size = 1
    ns.virtual_pipeline_model_parallel_size = None  # validate_args' default (no interleaving)
    ns.sequence_parallel = tp > 1
    ns.use_distributed_optimizer = distributed_optimizer
    ns.recompute_granularity = None if recompute == "none" else recompute
    ns.padded_vocab_size = padded_vocab_size(model.vocab_size, tp)
    return ns


class MegatronAccounting:
    """Megatron's figures for one namespace (see the module docstring for the sources)."""

    #: bytes per parameter Megatron assumes without the distributed optimizer
    BYTES_PER_PARAM = 18

    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns

    def params_on_most_loaded_shard(self) -> float:
        """Parameters held by the most loaded (TP, PP) shard: Megatron's weight-and-optimizer
        bytes without the distributed optimizer, divided by its 18 bytes per parameter."""
        from megatron.training.theoretical_memory_usage import compute_weight_and_optimizer_memory

        ns = copy.copy(self.ns)
        ns.use_distributed_optimizer = False
        return compute_weight_and_optimizer_memory(ns) / self.BYTES_PER_PARAM

    def weight_and_optimizer_bytes(self, *, shard_over: int) -> float:
        """Megatron's ``compute_weight_and_optimizer_memory`` with the distributed optimizer
        sharding over ``shard_over`` ranks (Megatron-Core shards over DP x CP)."""
        from megatron.training.theoretical_memory_usage import compute_weight_and_optimizer_memory

        ns = copy.copy(self.ns)
        ns.data_parallel_size = shard_over
        return compute_weight_and_optimizer_memory(ns)

    def activation_bytes(self, num_microbatches: int | None) -> float:
        """Megatron's ``compute_activation_memory`` (first stage, SP + selective formula) for
        the whole sequence; it knows no CP, so divide by CP for a per-GPU figure."""
        from megatron.training.theoretical_memory_usage import compute_activation_memory

        return compute_activation_memory(copy.copy(self.ns), num_microbatches)

    def train_flops(self, batch_size: int) -> float:
        """Megatron's ``num_floating_point_operations(args, batch_size)``: model FLOPs of one
        global batch of ``batch_size`` sequences of ``seq_length`` tokens (forward + backward)."""
        runtime.quiet()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.training.training import num_floating_point_operations

        return float(num_floating_point_operations(copy.copy(self.ns), batch_size))
