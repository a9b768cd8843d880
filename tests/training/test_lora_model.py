"""The trainer's LoRA hook at start-up: an adapter-only checkpoint to resume names its base."""

from __future__ import annotations

import argparse

import pytest

from megatron_endprompt.errors import UserError
from megatron_endprompt.model.lora_settings import LoraSettings
from megatron_endprompt.training.lora_model import check_lora_checkpoints

SETTINGS = LoraSettings(rank=2, alpha=2.0, adapters_only=True)


@pytest.fixture(scope="module")
def adapter_only_checkpoint(tmp_path_factory) -> str:
    """A ``torch_dist`` checkpoint of a tiny model's adapters alone (as an adapter-only save
    writes it)."""
    import torch
    from megatron.core import dist_checkpointing

    from megatron_endprompt.launch import single_process_group
    from megatron_endprompt.model.lora import LoraCheckpointing, apply_lora
    from megatron_endprompt.runtime import cpu_checkpoint_io, cpu_forward
    from tests.model.test_model_lora import _model

    out = tmp_path_factory.mktemp("adapters") / "iter_0000001"
    out.mkdir()
    with single_process_group(), cpu_forward(), cpu_checkpoint_io():
        model = apply_lora(_model(), SETTINGS,
                           checkpointing=LoraCheckpointing(base=False, adapters_only=True))
        with torch.no_grad():
            dist_checkpointing.save({"model": model.sharded_state_dict()}, str(out))
    (out.parent / "latest_checkpointed_iteration.txt").write_text("1")
    return str(out.parent)


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"load": None, "ckpt_step": None,
                                 "pretrained_checkpoint": None, **kw})


def test_adapter_only_resume_without_its_base_is_refused(adapter_only_checkpoint, tmp_path):
    with pytest.raises(UserError, match="holds LoRA adapters only; pass the base model it was "
                                        r"trained from as --pretrained-checkpoint"):
        check_lora_checkpoints(_args(load=adapter_only_checkpoint), SETTINGS)
    # with the base named (a checkpoint there), or without LoRA, nothing to say
    check_lora_checkpoints(_args(load=adapter_only_checkpoint,
                                 pretrained_checkpoint=adapter_only_checkpoint), SETTINGS)
    check_lora_checkpoints(_args(load=adapter_only_checkpoint), None)
    check_lora_checkpoints(_args(load=str(tmp_path)), SETTINGS)  # nothing to resume
