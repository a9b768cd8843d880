"""Megatron-Core ``GPTModel`` whose RoPE comes from ``position_ids``, on every pipeline stage.

How the injection works
-----------------------
:class:`EndPromptGPTModel` is built with exactly ``GPTModel``'s arguments (plus ``pi_factor``), so a
model provider swaps one class name. After ``GPTModel.__init__`` it replaces ``self.rotary_pos_emb``
by an :class:`~megatron_endprompt.model.rope.EndPromptRotaryEmbedding` taking over the stock
module's ``inv_freq`` (Llama-3.1 ``rope_scaling`` included), interleaving and CP group.

It overrides ``GPTModel._preprocess`` — the one place where 0.19 computes ``rotary_pos_emb`` for
the decoder (``forward`` and the combined-1F1B schedule plan both call it, on every pipeline and
virtual-pipeline stage, with the ``position_ids`` given to ``forward``). The override runs the stock
``_preprocess`` with its RoPE branch switched off (embedding, sequence-parallel scatter, padding
mask stay stock) and puts ``rotary_pos_emb = self.rotary_pos_emb(position_ids)`` into the result:
``[S, 1, 1, D]`` for a shared layout (TE fused RoPE still applies), else ``[S, B, 1, D]``.

So ``position_ids`` must be passed to ``forward`` on *every* stage, including middle and last
pipeline stages where stock ignores them; a missing or wrongly sized ``position_ids`` is an error,
never a silent fallback to contiguous positions. Under context parallelism they are this rank's
zig-zag slice and are used as is. Inference (``inference_context`` given) keeps stock behaviour
with contiguous positions, divided by the same PI factor.

Why checkpoint keys stay stock
------------------------------
The rotary module holds no parameter and no buffer (stock ``inv_freq`` is a plain attribute,
dropped on load), no other module is added or renamed, so ``state_dict`` and
``sharded_state_dict`` keys are exactly ``GPTModel``'s; checkpoints move freely both ways.
"""

from __future__ import annotations

from typing import Any

from megatron.core.models.gpt.gpt_model import GPTModel
from torch import Tensor

from megatron_endprompt.compat import GPT_PREPROCESS_ROTARY_INDEX, stock_rope_skipped
from megatron_endprompt.model.final_norm import block_spec_with_layer_norm
from megatron_endprompt.model.rope import EndPromptRotaryEmbedding
from megatron_endprompt.model.yarn import YarnScaling
from megatron_endprompt.runtime import check_megatron_version, installed_layers

__all__ = ["EndPromptGPTModel"]


def _require_rope_router() -> None:
    """TE's fused RoPE takes only ``[S, 1, 1, D]``; mixed-layout micro-batches need the runtime's
    router (:mod:`megatron_endprompt.runtime.rope`) in place before the first forward."""
    from megatron.core.models.common.embeddings import rope_utils

    if rope_utils.fused_apply_rotary_pos_emb is not None and not installed_layers()["rope"]:
        raise RuntimeError(
            "EndPromptGPTModel with apply_rope_fusion needs megatron_endprompt.runtime.install() "
            "first (it routes per-row RoPE freqs around TE's fused kernel)")


class EndPromptGPTModel(GPTModel):
    """``GPTModel`` with RoPE built from ``position_ids [B, S]`` divided by ``pi_factor``.

    Args: ``GPTModel``'s, plus keyword ``pi_factor`` (``s``; ``None`` -> Megatron's
    ``seq_len_interpolation_factor`` or 1) and keyword ``yarn`` (YaRN / NTK-by-parts frequencies
    instead of PI; its attention factor goes into the config's ``yarn_*`` fields, which
    Megatron's attention reads when it is built, so it multiplies cos/sin as HF does). Requires
    ``position_embedding_type='rope'`` without multi-latent attention. A layer spec's final norm
    is the layers' own norm class (:mod:`~megatron_endprompt.model.final_norm`), not TE's
    whenever TE is importable.
    """

    def __init__(self, config: Any, transformer_layer_spec: Any, *args: Any,
                 pi_factor: float | None = None, yarn: YarnScaling | None = None,
                 **kwargs: Any) -> None:
        check_megatron_version()
        if yarn is not None:
            for name, value in yarn.megatron_config_fields().items():
                setattr(config, name, value)
        transformer_layer_spec = block_spec_with_layer_norm(
            config, transformer_layer_spec, vp_stage=kwargs.get("vp_stage"),
            pg_collection=kwargs.get("pg_collection"))
        super().__init__(config, transformer_layer_spec, *args, **kwargs)
        if self.position_embedding_type != "rope" or self.config.multi_latent_attention:
            raise ValueError(
                "EndPrompt needs position_embedding_type='rope' without multi-latent attention "
                f"(got {self.position_embedding_type!r}, "
                f"multi_latent_attention={self.config.multi_latent_attention})"
            )
        if getattr(self.config, "fused_single_qkv_rope", False):
            raise ValueError(
                "fused_single_qkv_rope takes only [S, 1, 1, D] freqs; EndPrompt batches with "
                "differing layouts need per-row RoPE: turn it off"
            )
        self.rotary_pos_emb = EndPromptRotaryEmbedding.from_stock(
            self.rotary_pos_emb, pi_factor=pi_factor, yarn=yarn,
            rotary_base=kwargs.get("rotary_base", 10000),
            llama3=bool(kwargs.get("rope_scaling", False)),
        )
        if self.config.apply_rope_fusion:
            _require_rope_router()

    @property
    def pi_factor(self) -> float:
        """``s``: position ids are divided by it before RoPE."""
        return self.rotary_pos_emb.pi_factor

    def _preprocess(
        self,
        input_ids: Tensor | None,
        position_ids: Tensor | None,
        decoder_input: Tensor | None = None,
        inference_context: Any = None,
        packed_seq_params: Any = None,
        **kwargs: Any,
    ) -> tuple:
        """Stock preprocessing with ``rotary_pos_emb`` from ``position_ids`` (``[B, S]``, this
        CP rank's slice) -> ``[S, 1|B, 1, D]``. Returns stock's tuple."""
        if inference_context is not None:
            return super()._preprocess(
                input_ids,
                position_ids,
                decoder_input=decoder_input,
                inference_context=inference_context,
                packed_seq_params=packed_seq_params,
                **kwargs,
            )
        if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
            raise NotImplementedError("EndPrompt RoPE does not support packed (thd) sequences")
        if position_ids is None:
            raise ValueError(
                "EndPromptGPTModel needs position_ids on every pipeline stage (stock get_batch "
                "gives middle/last stages none); pass the sample's EndPrompt positions"
            )
        with stock_rope_skipped(self):
            output = super()._preprocess(
                input_ids,
                position_ids,
                decoder_input=decoder_input,
                inference_context=None,
                packed_seq_params=packed_seq_params,
                **kwargs,
            )
        self._check_positions(position_ids, output[0])
        output = list(output)
        output[GPT_PREPROCESS_ROTARY_INDEX] = self.rotary_pos_emb(position_ids)
        return tuple(output)

    def _check_positions(self, position_ids: Tensor, decoder_input: Any) -> None:
        """``position_ids [B, S]`` must cover this rank's attention sequence: the hidden states'
        ``S`` (times TP under sequence parallelism), already divided by CP — catches positions
        that were not, or twice, zig-zag sliced."""
        hidden = decoder_input if decoder_input is not None else self.decoder.input_tensor
        if not isinstance(hidden, Tensor):
            return
        seq = hidden.size(0)
        if self.config.sequence_parallel:
            seq *= self.config.tensor_model_parallel_size
        if position_ids.dim() != 2 or position_ids.shape[1] != seq:
            raise ValueError(
                f"position_ids {tuple(position_ids.shape)} do not match this rank's sequence "
                f"length {seq} (context parallel: pass positions sliced once, like the tokens)"
            )
        if position_ids.shape[0] not in (1, hidden.size(1)):
            raise ValueError(
                f"position_ids batch {position_ids.shape[0]} != micro-batch {hidden.size(1)}"
            )
