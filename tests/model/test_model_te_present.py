"""Transformer Engine importable on a machine without CUDA: the CPU model must keep working.

The real package is absent here, so its presence is faked the way Megatron-Core sees it: with
TE importable, ``transformer_block`` sets ``HAVE_TE`` and makes ``LayerNormImpl`` TE's
``TENorm`` at import, the final norm of every block built from a single layer spec. TE modules
refuse to build without CUDA; :class:`CudaOnlyNorm` does the same.
"""

from __future__ import annotations

import pytest
import torch
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

from megatron_endprompt.model import EndPromptGPTModel
from megatron_endprompt.model.final_norm import block_spec_with_layer_norm

from tests.model.test_model_gpt import batch, build, tiny_config


class CudaOnlyNorm(torch.nn.Module):
    """Stands in for ``TENorm`` on a machine without CUDA: cannot be built."""

    def __init__(self, *args, **kwargs) -> None:
        raise RuntimeError("CudaOnlyNorm: Transformer Engine modules need a CUDA device")


@pytest.fixture
def te_importable(monkeypatch):
    """Megatron's module globals as they are when ``transformer_engine`` imports."""
    import megatron.core.transformer.transformer_block as transformer_block

    monkeypatch.setattr(transformer_block, "HAVE_TE", True)
    monkeypatch.setattr(transformer_block, "LayerNormImpl", CudaOnlyNorm)


def _forward(model) -> torch.Tensor:
    input_ids, mask = batch()
    positions = torch.arange(input_ids.shape[1]).repeat(input_ids.shape[0], 1)
    with torch.no_grad():
        return model(input_ids, positions, mask)


def test_local_spec_model_builds_and_matches_with_te_importable(cpu_forward, te_importable) -> None:
    """Old code: ``EndPromptGPTModel`` with the local spec built the final norm from
    ``LayerNormImpl`` (TENorm when TE imports) and failed on a CPU machine with TE installed."""
    model = build(EndPromptGPTModel)
    final = model.decoder.final_layernorm
    assert type(final) is type(model.decoder.layers[0].input_layernorm)
    assert not isinstance(final, CudaOnlyNorm)
    assert len(model.decoder.layers) == 2
    out = _forward(model)
    assert torch.isfinite(out).all()
    keys = set(model.state_dict())
    assert "decoder.final_layernorm.weight" in keys


def test_final_norm_choice_does_not_change_the_model(cpu_forward) -> None:
    """Without TE the rewritten block spec builds the same model as stock (same keys, same
    logits): it only pins the final norm to the class stock picks when TE is absent."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    stock, ours = build(GPTModel), build(EndPromptGPTModel)
    assert set(stock.state_dict()) == set(ours.state_dict())
    assert type(stock.decoder.final_layernorm) is type(ours.decoder.final_layernorm)
    input_ids, mask = batch()
    with torch.no_grad():
        torch.testing.assert_close(stock(input_ids, None, mask), _forward(ours), rtol=0, atol=0)


def test_block_spec_keeps_fused_norm_specs_and_counts_stage_layers(megatron_parallel) -> None:
    """A layer spec whose input norm is fused into its first linear (TE's spec: ``IdentityOp``)
    keeps Megatron's choice; a local layer spec becomes a block of this stage's layer count."""
    from megatron.core.transformer.identity_op import IdentityOp

    config = tiny_config(num_layers=3)
    local = get_gpt_layer_local_spec(normalization="RMSNorm")
    block = block_spec_with_layer_norm(config, local, vp_stage=None, pg_collection=None)
    assert isinstance(block, TransformerBlockSubmodules)
    assert block.layer_specs == [local] * 3
    assert block.layer_norm is local.submodules.input_layernorm
    fused = get_gpt_layer_local_spec(normalization="RMSNorm")
    fused.submodules.input_layernorm = IdentityOp
    assert block_spec_with_layer_norm(config, fused, vp_stage=None, pg_collection=None) is fused
    assert block_spec_with_layer_norm(config, block, vp_stage=None, pg_collection=None) is block
