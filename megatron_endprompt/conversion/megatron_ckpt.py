"""Megatron-Core ``torch_dist`` checkpoints on one CPU process: write, find, read.

Layout written (what ``megatron.training.checkpointing.load_checkpoint`` reads)::

    DIR/latest_checkpointed_iteration.txt     "release"
    DIR/release/                              dist_checkpointing.save(...) of
        {"args": Namespace, "checkpoint_version": 3.0, "iteration": 0,
         "model": model.sharded_state_dict()}

A ``release`` checkpoint loads with iteration 0 and without optimizer or RNG state, with or
without ``--finetune``. Tensors are stored as global tensors (per-layer weights stacked on a
leading layer axis, QKV per query group, ``linear_fc1`` as ``[gate; up]``), so a run at any
TP/PP reshards them on load; only the padded vocabulary is fixed (Megatron pads to a multiple of
``--make-vocab-size-divisible-by`` x TP, see :func:`padded_vocab_size`).

Reading needs neither GPUs nor the saving run's layout: :func:`read_tensor` asks
``dist_checkpointing.load`` for one global tensor at a time, in a single-process gloo group.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from megatron_endprompt import launch
from megatron_endprompt.checkpoint_dir import TRACKER_FILE, resolve_checkpoint_dir
from megatron_endprompt.conversion.writer_failure import writer_errors, writer_os_error
from megatron_endprompt.errors import UserError
from megatron_endprompt.model import EndPromptHybridModel
from megatron_endprompt.runtime import cpu_checkpoint_io

__all__ = [
    "TRACKER_FILE",
    "build_gpt_model",
    "build_hybrid_model",
    "find_checkpoint",
    "load_common_state",
    "load_model_weights",
    "padded_vocab_size",
    "read_tensor",
    "save_release_checkpoint",
    "single_process_group",
    "tensor_metadata",
]



def padded_vocab_size(vocab_size: int, *, divisible_by: int = 128,
                      tensor_parallel_size: int = 1) -> int:
    """Megatron's padded vocabulary (``vocab_size_with_padding``)."""
    multiple = divisible_by * tensor_parallel_size
    return int(math.ceil(vocab_size / multiple) * multiple)


@contextlib.contextmanager
def single_process_group() -> Iterator[None]:
    """The single-process Megatron setup (gloo, world size 1, TP=PP=1) plus
    :func:`~megatron_endprompt.runtime.cpu_checkpoint_io` without CUDA, for the duration."""
    with launch.single_process_group(), cpu_checkpoint_io():
        yield


def _config_and_spec(args: Any, *, te_spec: bool, initialize: bool) -> tuple[Any, Any]:
    """The CPU ``TransformerConfig`` and the GPT layer spec (local unless ``te_spec``) of a
    Megatron-LM argument namespace (Qwen2's ``add_qkv_bias`` and Qwen3's ``qk_layernorm``
    included)."""
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )
    from megatron.core.transformer.transformer_config import TransformerConfig

    heads = args.num_attention_heads
    qk_norm = bool(getattr(args, "qk_layernorm", False))  # Qwen3
    config = TransformerConfig(
        num_layers=args.num_layers, hidden_size=args.hidden_size,
        ffn_hidden_size=args.ffn_hidden_size, num_attention_heads=heads,
        num_query_groups=(args.num_query_groups if args.group_query_attention else heads),
        kv_channels=args.kv_channels or args.hidden_size // heads,
        normalization="RMSNorm", layernorm_epsilon=args.layernorm_epsilon,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        params_dtype=args.params_dtype, use_cpu_initialization=True,
        perform_initialization=initialize, hidden_dropout=0.0, attention_dropout=0.0,
        apply_rope_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False, add_qkv_bias=bool(getattr(args, "add_qkv_bias", False)),
        qk_layernorm=qk_norm,
    )
    spec = (get_gpt_layer_with_transformer_engine_spec(qk_layernorm=qk_norm) if te_spec
            else get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=qk_norm))
    return config, spec


def _model_kwargs(args: Any) -> dict[str, Any]:
    """The keywords ``GPTModel`` and ``EndPromptHybridModel`` share."""
    return dict(
        vocab_size=args.padded_vocab_size, max_sequence_length=args.max_position_embeddings,
        position_embedding_type="rope", rotary_base=int(args.rotary_base), rotary_percent=1.0,
        rope_scaling=bool(getattr(args, "use_rope_scaling", False)),
        rope_scaling_factor=float(getattr(args, "rope_scaling_factor", 8.0)),
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights)


def build_gpt_model(args: Any, *, cls: type | None = None, te_spec: bool = False,
                    initialize: bool = False, **kwargs: Any) -> torch.nn.Module:
    """A TP=1, PP=1 GPT model (stock ``GPTModel`` unless ``cls``) on the CPU for a Megatron-LM
    argument namespace (Qwen2's ``add_qkv_bias`` and Qwen3's ``qk_layernorm`` included),
    parameters in ``args.params_dtype``, left uninitialised unless ``initialize``. Needs
    :func:`single_process_group`."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    config, spec = _config_and_spec(args, te_spec=te_spec, initialize=initialize)
    return (cls or GPTModel)(config=config, transformer_layer_spec=spec,
                             **_model_kwargs(args), **kwargs)


def build_hybrid_model(args: Any, *, cls: type | None = None, te_spec: bool = False,
                       initialize: bool = False, **kwargs: Any) -> torch.nn.Module:
    """A TP=1, PP=1 ``HybridModel`` of ``args.hybrid_layer_pattern`` over the layer spec
    :func:`build_gpt_model` uses (Llama-style patterns:
    :mod:`megatron_endprompt.model.hybrid_spec`), as
    :class:`~megatron_endprompt.model.EndPromptHybridModel` unless ``cls`` (stock ``HybridModel``
    takes no Llama-3.1 ``rope_scaling``); a pattern's ``|`` pipeline splits are dropped (one stage
    holds every layer). Needs :func:`single_process_group`."""
    config, spec = _config_and_spec(args, te_spec=te_spec, initialize=initialize)
    return (cls or EndPromptHybridModel)(config=config, hybrid_stack_spec=spec,
                                         # PP=1: all stages' layers ('|' splits dropped)
                                         hybrid_layer_pattern=args.hybrid_layer_pattern.replace(
                                             "|", ""),
                                         **_model_kwargs(args), **kwargs)


def save_release_checkpoint(model: torch.nn.Module, args: Any, out_dir: str) -> str:
    """Write ``model`` as a ``release`` ``torch_dist`` checkpoint under ``out_dir`` with the
    saved ``args``; returns the checkpoint directory. Needs :func:`single_process_group`."""
    from megatron.core import dist_checkpointing

    ckpt_dir = os.path.join(out_dir, "release")
    os.makedirs(ckpt_dir, exist_ok=True)
    state = {
        "args": args,
        "checkpoint_version": 3.0,
        "iteration": 0,
        "model": model.sharded_state_dict(),
    }
    # Megatron's content metadata for a model-only checkpoint (no distributed optimizer).
    from torch.distributed.checkpoint.api import CheckpointException

    with writer_errors() as logged:
        try:
            dist_checkpointing.save(state, ckpt_dir, content_metadata={
                "singleton_local_shards": False, "chained_optim_avoid_prefix": True})
        except (Exception, CheckpointException) as exc:  # a BaseException; OS errors unwrapped
            os_error = writer_os_error(exc, logged, ckpt_dir)
            if os_error is None:
                for text in logged:
                    exc.add_note(f"checkpoint writer: {text}")
                raise
            raise OSError(os_error.errno, os_error.strerror,
                          os_error.filename or ckpt_dir) from None
    with open(os.path.join(out_dir, TRACKER_FILE), "w") as f:
        f.write("release")
    return ckpt_dir


def find_checkpoint(path: str) -> str:
    """The ``torch_dist`` checkpoint directory for ``path``: a save directory (follows
    ``latest_checkpointed_iteration.txt``; else the newest ``iter_*``) or an ``iter_*`` /
    ``release`` directory itself. Raises :class:`UserError`."""
    from megatron.core import dist_checkpointing

    if not os.path.isdir(path):
        raise UserError(f"--checkpoint {path}: no such directory")
    candidate = resolve_checkpoint_dir(path, newest_without_tracker=True)
    if candidate is None:
        raise UserError(f"--checkpoint {path}: no Megatron checkpoint there (no {TRACKER_FILE},"
                        " iter_* or release directory)")
    _check_metadata_json(candidate)
    if not dist_checkpointing.check_is_distributed_checkpoint(candidate):
        raise UserError(f"{candidate} is not a torch_dist checkpoint (save with "
                        "--ckpt-format torch_dist, Megatron's default)")
    if not os.path.isfile(os.path.join(candidate, ".metadata")):
        raise UserError(f"{candidate}: .metadata is missing (the save did not finish or the copy "
                        "is incomplete); convert another iter_* directory or copy it again")
    return candidate


def _check_metadata_json(ckpt_dir: str) -> None:
    """``metadata.json`` (if present) must be a JSON object: Megatron's reader stops with a
    ``UnicodeDecodeError``/``JSONDecodeError`` traceback on a damaged one."""
    import json

    path = os.path.join(ckpt_dir, "metadata.json")
    if not os.path.isfile(path):
        return
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{path} is damaged (not JSON: {exc}); copy the checkpoint again or "
                        "convert another iter_* directory") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path} is damaged (a JSON {type(doc).__name__}, not an object); copy "
                        "the checkpoint again or convert another iter_* directory")


def load_common_state(ckpt_dir: str) -> dict[str, Any]:
    """The checkpoint's common (non-tensor) state: ``args``, ``iteration``, ..."""
    from megatron.core import dist_checkpointing
    from megatron.core.safe_globals import register_safe_globals

    register_safe_globals()
    return dist_checkpointing.load_common_state_dict(ckpt_dir)


def tensor_metadata(ckpt_dir: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """``{checkpoint key: (global shape, dtype)}`` of every tensor in the checkpoint."""
    from megatron.core import dist_checkpointing

    meta = dist_checkpointing.load_tensors_metadata(ckpt_dir)
    return {k: (tuple(v.global_shape), v.dtype) for k, v in meta.items()}


def read_tensor(ckpt_dir: str, key: str, meta: tuple[tuple[int, ...], torch.dtype]) -> Tensor:
    """One global tensor of the checkpoint (per-layer weights: ``[num_layers, ...]``), whatever
    TP/PP saved it. Needs :func:`single_process_group`.

    (Megatron 0.19 cannot load a partial slice of a global tensor in a world of size 1: it
    places the other slices on rank ``(rank + 1) % world_size``, i.e. on itself.)"""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    shape, dtype = meta
    request = ShardedTensor.from_rank_offsets(key, torch.empty(shape, dtype=dtype), replica_id=0)
    loaded = dist_checkpointing.load({"t": request}, ckpt_dir)
    return loaded["t"]


def load_model_weights(model: torch.nn.Module, ckpt_dir: str) -> None:
    """Load a checkpoint's ``model`` weights into a TP=PP=1 ``model`` (strict): what Megatron's
    ``load_checkpoint`` does for the model part. Needs :func:`single_process_group`."""
    from megatron.core import dist_checkpointing

    loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, ckpt_dir)
    model.load_state_dict(loaded["model"], strict=True)
