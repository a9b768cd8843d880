"""The decoder's final norm follows the layer spec's own norm, not whether TE is importable.

Given a single *layer* spec, Megatron-Core's ``TransformerBlock`` picks the final norm from a
module global set at import: ``TENorm`` whenever Transformer Engine is importable, whatever the
layers are. With TE installed on a machine without CUDA, a model built from the *local* layer
spec (the CPU runtime's ``--transformer-impl local``, conversion, unit tests) then gets a TE
final norm, which cannot run there. :func:`block_spec_with_layer_norm` turns such a layer spec
into the block spec Megatron would build — same layers, same count on this (virtual) pipeline
stage — whose final norm is the class the layers themselves normalise with. A layer spec whose
input norm is fused into its first linear (TE's spec: ``IdentityOp``) is returned unchanged, so
GPU runs keep Megatron's choice. Checkpoint keys do not change (``final_layernorm.weight``).
"""

from __future__ import annotations

from typing import Any

from megatron.core import parallel_state
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_layer import BaseTransformerLayer
from megatron.core.utils import get_pg_rank

__all__ = ["block_spec_with_layer_norm"]


def _pipeline_rank(pg_collection: Any) -> int:
    """This rank's pipeline stage, found the way ``TransformerBlock`` finds it."""
    if pg_collection is not None:
        return get_pg_rank(getattr(pg_collection, "pp", None))
    if not parallel_state.model_parallel_is_initialized():
        return 0
    return get_pg_rank(parallel_state.get_pipeline_model_parallel_group())


def block_spec_with_layer_norm(config: Any, spec: Any, *, vp_stage: int | None,
                               pg_collection: Any) -> Any:
    """``spec`` as a ``TransformerBlockSubmodules`` whose final norm is the layers' input norm.

    Args:
        config: the model's ``TransformerConfig`` (layer count per stage, pipeline layout).
        spec: what ``GPTModel`` takes as ``transformer_layer_spec``; block specs, non-layer
            specs and layer specs with a fused input norm come back unchanged.
        vp_stage, pg_collection: as given to ``GPTModel`` (the stage's layer count).
    """
    if not (isinstance(spec, ModuleSpec) and isinstance(spec.module, type)
            and issubclass(spec.module, BaseTransformerLayer)):
        return spec
    norm = getattr(spec.submodules, "input_layernorm", IdentityOp)
    if norm is IdentityOp:
        return spec
    count = get_num_layers_to_build(config, vp_stage=vp_stage,
                                    pp_rank=_pipeline_rank(pg_collection))
    return TransformerBlockSubmodules(layer_specs=[spec] * count, layer_norm=norm)
