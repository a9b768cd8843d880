"""One micro-batch on this rank, with EndPrompt ``position_ids`` on *every* rank.

Stock ``pretrain_gpt.get_batch`` gives middle pipeline stages no tensors and the last stage
no ``position_ids`` — fine for contiguous RoPE, wrong for EndPrompt, where every stage's
attention needs the jumped positions. What we do, and why it is the cheapest correct way:

* **PP**: the dataset and its loader are built on TP rank 0 of *every* pipeline stage
  (``is_built_on_rank`` in :mod:`providers`). Each stage reads the same samples in the same
  order (the sampler depends on the DP rank only), so no extra pipeline communication is
  needed; a stage reads ``B x P`` tokens from a memory map, which is noise next to its compute.
* **TP**: TP rank 0 broadcasts, within the TP group, exactly the tensors its stage needs
  (first: tokens + positions; last: labels + loss_mask + positions; middle: positions; one
  stage: all), with ``GPTDataset``'s dtypes (int64, float32 loss weights, bool mask).
* **CP**: the whole batch, positions included, goes through Megatron's own
  ``get_batch_on_this_cp_rank`` (zig-zag into ``2 * cp`` chunks), once; the model consumes the
  sliced positions as they are and never slices again.

The last stage also gets ``terminal_mask`` (float32 ``[B, S]``: 1 where the prediction belongs
to the terminal segment, i.e. index ``i >= a - 1``), so that the context and terminal losses
are logged separately. It comes from the dataset, which knows each sample's ``a``
(:class:`~megatron_endprompt.data.dataset.EndPromptGPTDataset` emits it), and travels with
the labels (TP broadcast, CP slicing); it is not rebuilt from position jumps, which cannot see a
``random`` placement that drew ``T = a``. A dataset without the key (Megatron's own
``GPTDataset``, mock data) has no terminal: the mask is all 0.
"""

from __future__ import annotations

from typing import Any

import torch

_INT = torch.int64


def _needed_keys(first: bool, last: bool, with_mask: bool) -> list[str]:
    keys = ["position_ids"]
    if first:
        keys.append("tokens")
    if last:
        keys += ["labels", "loss_mask", "terminal_mask"]
    if with_mask:
        keys.append("attention_mask")
    return keys


def _spec(key: str, mbs: int, seq: int) -> tuple[tuple[int, ...], torch.dtype]:
    if key == "attention_mask":
        return (mbs, 1, seq, seq), torch.bool
    if key in ("loss_mask", "terminal_mask"):
        return (mbs, seq), torch.float32
    return (mbs, seq), _INT


def get_batch(data_iterator: Any, *, first_stage: bool, last_stage: bool) -> dict[str, Any]:
    """This rank's micro-batch: tensors ``[B, S_local]`` on the current device.

    Keys: ``position_ids`` always; ``tokens`` on the first stage; ``labels``, ``loss_mask``,
    ``terminal_mask`` on the last; ``attention_mask`` when the dataloader creates it.
    """
    from megatron.core import parallel_state as mpu
    from megatron.core.utils import get_batch_on_this_cp_rank
    from megatron.training import get_args

    args = get_args()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")
    with_mask = bool(getattr(args, "create_attention_mask_in_dataloader", False))
    keys = _needed_keys(first_stage, last_stage, with_mask)
    if last_stage and getattr(args, "mtp_num_layers", None) and "tokens" not in keys:
        keys.append("tokens")  # Megatron's MTP block on the last stage embeds the next tokens
    tp_size = mpu.get_tensor_model_parallel_world_size()
    if mpu.get_tensor_model_parallel_rank() == 0:
        assert data_iterator is not None, "TP rank 0 of every stage must have a data iterator"
        sample = next(data_iterator)
        if "terminal_mask" in keys and "terminal_mask" not in sample:  # no EndPrompt data
            sample["terminal_mask"] = torch.zeros(sample["labels"].shape, dtype=torch.float32)
        batch = {k: sample[k].to(device, non_blocking=True) for k in keys}
    else:
        batch = {}
        for k in keys:
            shape, dtype = _spec(k, args.micro_batch_size, args.seq_length)
            batch[k] = torch.empty(shape, dtype=dtype, device=device)
    if tp_size > 1:
        src, group = mpu.get_tensor_model_parallel_src_rank(), mpu.get_tensor_model_parallel_group()
        for k in keys:
            batch[k] = batch[k].contiguous()
            torch.distributed.broadcast(batch[k], src, group=group)
    if mpu.get_context_parallel_world_size() > 1:
        batch["cu_seqlens"] = None
        batch = get_batch_on_this_cp_rank(batch, is_hybrid_cp=False,
                                          cp_group=mpu.get_context_parallel_group())
        batch.pop("cu_seqlens", None)
    return batch
