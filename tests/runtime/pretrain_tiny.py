"""Tiny Llama-style GPT trained by Megatron-Core's real ``megatron.training.pretrain``.

This is the driver the runtime tests launch under ``torchrun`` (CPU, gloo). It calls
``megatron_endprompt.runtime.install(trainer=True)`` first (as the pretrain entry), then follows
Megatron-LM's own entry flow: ``parse_and_validate_args`` ->
``pretrain_cfg_container_from_args`` -> ``pretrain``, with ``--mock-data`` datasets, a
``GPTModel`` built from the local (non-TE) layer spec and a per-token-loss forward step.

Besides Megatron's usual log, every rank that computes a loss appends one JSON line per
training micro-batch to ``<--losses-dir>/rank<R>.jsonl`` holding the iteration and the
micro-batch's mean token loss at full float precision, so tests can compare runs exactly.

Example::

    CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc_per_node 2 tests/runtime/pretrain_tiny.py \\
        --tensor-model-parallel-size 2 --train-iters 10 --losses-dir /tmp/losses
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial

# Make the in-repo package importable when launched as a script from anywhere.
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from megatron_endprompt.runtime import CPU_ARGS  # noqa: E402  (after the sys.path fix)
from tests.support.megatron_flags import tiny_llama_flags  # noqa: E402

#: Flags every CPU run needs (gloo, the local layer spec, no CUDA-only fusions).
CPU_FLAGS: list[str] = list(CPU_ARGS)

#: A tiny Llama: RMSNorm, SwiGLU, RoPE, untied embeddings, no biases (Megatron's default
#: dropout kept), trained on mock data.
TINY_LLAMA_FLAGS: list[str] = [
    *tiny_llama_flags(dropout_off=False),
    "--mock-data",
    "--micro-batch-size", "2",
    "--global-batch-size", "8",
    "--lr", "3e-3",
    "--min-lr", "1e-4",
    "--lr-decay-style", "cosine",
    "--lr-warmup-iters", "1",
    "--weight-decay", "0.01",
    "--clip-grad", "1.0",
    "--seed", "1234",
    "--calculate-per-token-loss",
    "--log-interval", "1",
    "--eval-iters", "0",
    "--eval-interval", "1000",
    "--split", "949,50,1",
    "--num-workers", "0",
    "--ckpt-format", "torch_dist",
]


def add_driver_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register the driver's own flags with Megatron's parser."""
    group = parser.add_argument_group(title="tiny pretrain driver")
    group.add_argument("--losses-dir", type=str, default=None,
                       help="Directory for per-rank JSON-lines loss records.")
    return parser


def model_provider(pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None,
                   config=None, pg_collection=None):
    """Build this pipeline stage's ``GPTModel`` with the local layer spec."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.training import get_args
    from megatron.training.arguments import core_transformer_config_from_args

    args = get_args()
    if config is None:
        config = core_transformer_config_from_args(args)
    spec = get_gpt_layer_local_spec(normalization=args.normalization)
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        rotary_percent=args.rotary_percent,
        rotary_base=args.rotary_base,
        vp_stage=vp_stage,
        pg_collection=pg_collection,
    )


def train_valid_test_datasets_provider(train_val_test_num_samples: list[int],
                                       vp_stage: int | None = None):
    """Build mock GPT datasets on every rank (cheap, so every rank reads its own batches)."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder)
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset
    from megatron.training import get_args, get_tokenizer

    args = get_args()
    config = GPTDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=None,
        split=args.split,
        tokenizer=get_tokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        mmap_bin_files=False,
    )
    return BlendedMegatronDatasetBuilder(
        MockGPTDataset, train_val_test_num_samples, lambda: True, config
    ).build()


train_valid_test_datasets_provider.is_distributed = True


def _record_loss(loss_per_token: float) -> None:
    """Append one training micro-batch's mean token loss to this rank's JSON-lines file."""
    import torch
    from megatron.training import get_args

    args = get_args()
    if args.losses_dir is None or not torch.is_grad_enabled():
        return
    os.makedirs(args.losses_dir, exist_ok=True)
    rank = torch.distributed.get_rank()
    with open(os.path.join(args.losses_dir, f"rank{rank}.jsonl"), "a") as fh:
        fh.write(json.dumps({"iteration": int(args.curr_iteration) + 1,
                             "loss": float(loss_per_token)}) + "\n")


def loss_func(loss_mask, output_tensor):
    """Per-token loss: return the masked loss sum and the token count (Megatron normalises)."""
    import torch

    losses = output_tensor.float()
    loss_mask = loss_mask.view(-1).float()
    loss_sum = torch.sum(losses.view(-1) * loss_mask)
    num_tokens = loss_mask.sum().clone().detach().to(torch.int)
    _record_loss((loss_sum.detach() / num_tokens.clamp(min=1)).item())
    report = torch.cat([loss_sum.clone().detach().view(1), num_tokens.float().view(1)])
    return loss_sum, num_tokens, {"lm loss": report}


def forward_step(data_iterator, model):
    """Read one micro-batch and run the model; labels make GPTModel return token losses."""
    batch = next(data_iterator) if data_iterator is not None else None
    tokens = batch["tokens"].cuda()
    labels = batch["labels"].cuda()
    loss_mask = batch["loss_mask"].cuda()
    position_ids = batch["position_ids"].cuda()
    output_tensor = model(tokens, position_ids, None, labels=labels)
    return output_tensor, partial(loss_func, loss_mask)


def main(argv: list[str] | None = None) -> None:
    """Install the runtime (the CPU layer here), then run Megatron's pretrain with the tiny GPT."""
    from megatron_endprompt import runtime

    runtime.install(trainer=True)  # a training rank, as the pretrain entry installs it
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")

    from megatron.core.enums import ModelType
    from megatron.training import pretrain

    from megatron_endprompt.runtime.versions import call_pretrain
    from megatron.training.argument_utils import pretrain_cfg_container_from_args
    from megatron.training.arguments import parse_and_validate_args

    user_args = sys.argv[1:] if argv is None else argv
    sys.argv = [sys.argv[0], *CPU_FLAGS, *TINY_LLAMA_FLAGS, *user_args]
    args = parse_and_validate_args(extra_args_provider=add_driver_args)
    cfg = pretrain_cfg_container_from_args(args)
    call_pretrain(pretrain, cfg, train_valid_test_datasets_provider,
                  ModelType.encoder_or_decoder, forward_step, model_provider=model_provider)


if __name__ == "__main__":
    main()
