"""Megatron-Core ``HybridModel`` (``GPTModel``'s successor) whose RoPE comes from ``position_ids``.

``HybridModel`` has no ``_preprocess``: its ``forward`` computes RoPE inline from
``self.rotary_pos_emb(rotary_seq_len, packed_seq=...)``. :class:`EndPromptHybridModel` replaces
that module by an :class:`~megatron_endprompt.model.rope.EndPromptRotaryEmbedding` and hands it
the batch's positions per call through the public ``forward``
(:class:`~megatron_endprompt.model.positions.EndPromptPositions`, shared with
:class:`~megatron_endprompt.model.gpt.EndPromptGPTModel`), on every pipeline stage.

A Llama-style model is the pattern ``"*-" * num_layers`` over a GPT layer spec (give the layer
spec itself, or :func:`~megatron_endprompt.model.hybrid_spec.hybrid_stack_spec_from_layer_spec`
of it): the same network as ``GPTModel`` with that layer spec. Stock ``HybridModel`` takes no
Llama-3.1 ``rope_scaling`` and ignores ``config.rotary_interleaved`` when it builds its RoPE;
ours takes ``GPTModel``'s ``rope_scaling``/``rope_scaling_factor`` keywords and follows the
config's interleaving, as ``GPTModel`` does. The RoPE module holds no parameter or buffer:
checkpoint keys are stock ``HybridModel``'s.
"""

from __future__ import annotations

import inspect
from typing import Any

from megatron.core.models.hybrid.hybrid_model import HybridModel

from megatron_endprompt.model.hybrid_spec import (
    hybrid_stack_spec_from_layer_spec,
    is_layer_spec,
)
from megatron_endprompt.model.positions import EndPromptPositions
from megatron_endprompt.model.yarn import YarnScaling

__all__ = ["EndPromptHybridModel"]


class EndPromptHybridModel(EndPromptPositions, HybridModel):
    """``HybridModel`` with RoPE built from ``position_ids [B, S]`` divided by ``pi_factor``.

    Args: ``HybridModel``'s (``hybrid_stack_spec`` may be a GPT layer spec, see the module
    docstring), plus keywords ``pi_factor`` (``s``; ``None`` -> ``seq_len_interpolation_factor``
    or 1), ``yarn`` (YaRN / NTK-by-parts instead of PI; its attention factor goes into the
    config's ``yarn_*`` fields as for ``EndPromptGPTModel``), ``rope_scaling`` and
    ``rope_scaling_factor`` (Llama-3.1 frequency scaling, as ``GPTModel``'s). Requires
    ``position_embedding_type='rope'`` without multi-latent attention.
    """

    def __init__(self, config: Any, hybrid_stack_spec: Any, *args: Any,
                 pi_factor: float | None = None, yarn: YarnScaling | None = None,
                 rope_scaling: bool = False, rope_scaling_factor: float = 8.0,
                 **kwargs: Any) -> None:
        if yarn is not None:
            for name, value in yarn.megatron_config_fields().items():
                setattr(config, name, value)
        if is_layer_spec(hybrid_stack_spec):
            hybrid_stack_spec = hybrid_stack_spec_from_layer_spec(hybrid_stack_spec)
        bound = inspect.signature(HybridModel.__init__).bind(
            self, config, hybrid_stack_spec, *args, **kwargs)
        bound.apply_defaults()
        stock = bound.arguments
        super().__init__(config, hybrid_stack_spec, *args, **kwargs)
        self._check_rope_config()
        self.rotary_pos_emb = self._endprompt_rotary(
            stock, pi_factor=pi_factor, yarn=yarn, rope_scaling=rope_scaling,
            rope_scaling_factor=rope_scaling_factor, cp_group=self.pg_collection.cp)
