"""LoRA in the EndPrompt trainer: the model provider's one hook (:func:`lora_model`).

Megatron loads one checkpoint after the provider has built the model: ``--load`` when it holds
one, else ``--pretrained-checkpoint`` (``--finetune``). The adapters are offered to that load
only when the checkpoint has them (a LoRA run's own save); a base checkpoint loads into the
wrapped model's stock keys and the adapters keep their initial values (``B = 0``).
"""

from __future__ import annotations

import functools
from typing import Any

from megatron_endprompt.checkpoint_dir import resolve_checkpoint_dir
from megatron_endprompt.model.lora_settings import LoraSettings

__all__ = ["checkpoint_keys", "loaded_checkpoint_dir", "lora_model"]


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


def lora_model(model: Any, settings: LoraSettings | None, args: Any) -> Any:
    """``model`` (one pipeline chunk, just built) with adapters on ``settings.targets`` and its
    base frozen (:func:`~megatron_endprompt.model.lora.apply_lora`); unchanged when LoRA is
    off. Megatron's ``args`` name the checkpoint about to be loaded."""
    if settings is None:
        return model
    # here, not at the top: the adapters import Megatron, which the trainer loads later
    from megatron_endprompt.model.lora import LoraCheckpointing, apply_lora, is_adapter_key

    path = loaded_checkpoint_dir(args)
    has_adapters = path is not None and any(is_adapter_key(k) for k in checkpoint_keys(path))
    return apply_lora(model, settings,
                      checkpointing=LoraCheckpointing(adapters=path is None or has_adapters))
