"""Megatron-Core ``GPTModel`` whose RoPE comes from ``position_ids``, on every pipeline stage.

How the injection works
-----------------------
:class:`EndPromptGPTModel` is built with exactly ``GPTModel``'s arguments (plus ``pi_factor``
and ``yarn``), so a model provider swaps one class name. After ``GPTModel.__init__`` it replaces
``self.rotary_pos_emb`` by an :class:`~megatron_endprompt.model.rope.EndPromptRotaryEmbedding`
taking over the stock module's ``inv_freq`` (Llama-3.1 ``rope_scaling`` included), interleaving
and CP group. The batch's ``position_ids`` reach it per call through the public ``forward``
(:class:`~megatron_endprompt.model.positions.EndPromptPositions`): stock ``_preprocess`` runs
unchanged and its own ``self.rotary_pos_emb(rotary_seq_len, ...)`` call returns
``[S, 1, 1, D]`` for a shared layout (TE fused RoPE still applies), else ``[S, B, 1, D]``.

Why checkpoint keys stay stock
------------------------------
The rotary module holds no parameter and no buffer (stock ``inv_freq`` is a plain attribute,
dropped on load), no other module is added or renamed, so ``state_dict`` and
``sharded_state_dict`` keys are exactly ``GPTModel``'s; checkpoints move freely both ways.
"""

from __future__ import annotations

import inspect
from typing import Any

from megatron.core.models.gpt.gpt_model import GPTModel

from megatron_endprompt.model.final_norm import block_spec_with_layer_norm
from megatron_endprompt.model.positions import EndPromptPositions
from megatron_endprompt.model.yarn import YarnScaling

__all__ = ["EndPromptGPTModel"]


class EndPromptGPTModel(EndPromptPositions, GPTModel):
    """``GPTModel`` with RoPE built from ``position_ids [B, S]`` divided by ``pi_factor``.

    Args: ``GPTModel``'s, plus keyword ``pi_factor`` (``s``; ``None`` -> Megatron's
    ``seq_len_interpolation_factor`` or 1) and keyword ``yarn`` (YaRN / NTK-by-parts frequencies
    instead of PI; its attention factor goes into the config's ``yarn_*`` fields, which
    Megatron's attention reads when it is built, so it multiplies cos/sin as HF does). Requires
    ``position_embedding_type='rope'`` without multi-latent attention. A layer spec's final norm
    is the layers' own norm class (:mod:`~megatron_endprompt.model.final_norm`), not TE's
    whenever TE is importable. With TE's fused RoPE (``apply_rope_fusion``), mixed-layout
    micro-batches need the runtime's router (``megatron_endprompt.runtime.install()``).
    """

    def __init__(self, config: Any, transformer_layer_spec: Any, *args: Any,
                 pi_factor: float | None = None, yarn: YarnScaling | None = None,
                 **kwargs: Any) -> None:
        if yarn is not None:
            for name, value in yarn.megatron_config_fields().items():
                setattr(config, name, value)
        transformer_layer_spec = block_spec_with_layer_norm(
            config, transformer_layer_spec, vp_stage=kwargs.get("vp_stage"),
            pg_collection=kwargs.get("pg_collection"))
        bound = inspect.signature(GPTModel.__init__).bind(
            self, config, transformer_layer_spec, *args, **kwargs)
        bound.apply_defaults()
        stock = bound.arguments  # what GPTModel built its RotaryEmbedding from
        super().__init__(config, transformer_layer_spec, *args, **kwargs)
        self._check_rope_config()
        # Built from the same arguments as stock's (its CP group read back: where GPTModel
        # finds it differs between Megatron-Core versions).
        self.rotary_pos_emb = self._endprompt_rotary(
            stock, pi_factor=pi_factor, yarn=yarn, rope_scaling=stock["rope_scaling"],
            rope_scaling_factor=stock["rope_scaling_factor"],
            cp_group=self.rotary_pos_emb.cp_group)
