"""LoRA in the EndPrompt trainer: the model provider's one hook (:func:`lora_model`).

Megatron loads one checkpoint after the provider has built the model: ``--load`` when it holds
one, else ``--pretrained-checkpoint`` (``--finetune``). The model offers that load what the
checkpoint has:

* a base checkpoint (no adapters; the first launch): the base, into the wrapped model's stock
  keys; the adapters keep their initial values (``B = 0``);
* a LoRA run's full save: everything;
* an adapter-only save (``--endprompt-lora-adapters-only``): the adapters and their optimizer
  state; the frozen base is read here first, from ``--pretrained-checkpoint`` (the launcher's
  ``CHECKPOINT_IN``), with Megatron's ``dist_checkpointing`` at this run's TP/PP.
"""

from __future__ import annotations

import functools
from typing import Any

from megatron_endprompt.checkpoint_dir import resolve_checkpoint_dir
from megatron_endprompt.errors import UserError
from megatron_endprompt.model.lora import LoraCheckpointing, apply_lora, is_adapter_key
from megatron_endprompt.model.lora_settings import LoraSettings

__all__ = ["check_lora_checkpoints", "checkpoint_keys", "loaded_checkpoint_dir", "lora_model"]


def loaded_checkpoint_dir(args: Any) -> str | None:
    """The checkpoint directory Megatron's ``load_checkpoint`` will read for Megatron's
    ``args``: ``--load`` (at ``--ckpt-step``) when it holds a checkpoint, else
    ``--pretrained-checkpoint``; ``None`` for a run from scratch."""
    return (resolve_checkpoint_dir(getattr(args, "load", None),
                                   step=getattr(args, "ckpt_step", None))
            or resolve_checkpoint_dir(getattr(args, "pretrained_checkpoint", None)))


@functools.lru_cache(maxsize=8)
def checkpoint_keys(path: str) -> frozenset[str]:
    """The tensor keys of a ``torch_dist`` checkpoint (its ``.metadata`` only; empty for a
    checkpoint of another format)."""
    import os

    from torch.distributed.checkpoint import FileSystemReader

    if not os.path.exists(os.path.join(path, ".metadata")):
        return frozenset()
    return frozenset(FileSystemReader(path).read_metadata().state_dict_metadata)


def _has_base(keys: frozenset[str]) -> bool:
    """Whether a checkpoint holds model weights (not only adapters and optimizer state)."""
    return any(k.endswith(".weight") and not k.startswith("optimizer.") for k in keys)


def check_lora_checkpoints(args: Any, settings: LoraSettings | None) -> None:
    """Start-up check: an adapter-only checkpoint to resume needs ``--pretrained-checkpoint``
    (its base). Raises :class:`UserError` naming the flag."""
    path = loaded_checkpoint_dir(args) if settings is not None else None
    if path is None or _has_base(checkpoint_keys(path)):
        return
    if resolve_checkpoint_dir(getattr(args, "pretrained_checkpoint", None)) is None:
        raise UserError(f"{path} holds LoRA adapters only; pass the base model it was trained "
                        "from as --pretrained-checkpoint (CHECKPOINT_IN)")


def lora_model(model: Any, settings: LoraSettings | None, args: Any) -> Any:
    """``model`` (one pipeline chunk, just built) with adapters on ``settings.targets`` and its
    base frozen (:func:`~megatron_endprompt.model.lora.apply_lora`); unchanged when LoRA is
    off. Megatron's ``args`` name the checkpoint about to be loaded."""
    if settings is None:
        return model

    path = loaded_checkpoint_dir(args)
    keys = checkpoint_keys(path) if path is not None else frozenset()
    checkpointing = LoraCheckpointing(
        adapters=path is None or any(is_adapter_key(k) for k in keys),
        base=path is None or _has_base(keys), adapters_only=settings.adapters_only)
    model = apply_lora(model, settings, checkpointing=checkpointing)
    if not checkpointing.base:
        _load_base(model, resolve_checkpoint_dir(args.pretrained_checkpoint), checkpointing)
    return model


def _load_base(model: Any, base_dir: str, checkpointing: Any) -> None:
    """Read the frozen base of ``model`` (this rank's shards) from ``base_dir``; every rank
    calls it once per model chunk (``dist_checkpointing.load`` is collective)."""
    from megatron.core import dist_checkpointing

    checkpointing.adapters, checkpointing.base = False, True
    try:
        state = dist_checkpointing.load(model.sharded_state_dict(), base_dir)
    finally:
        checkpointing.adapters, checkpointing.base = True, False
    model.load_state_dict(state, strict=False)
