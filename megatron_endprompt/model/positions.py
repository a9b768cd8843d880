"""Hand the batch's ``position_ids`` to the RoPE module for one forward, for any Megatron model.

Megatron-Core's language models compute RoPE inside their own ``forward`` from a sequence length
only: ``GPTModel`` in ``_preprocess``, ``HybridModel`` (0.19+) inline in ``forward``, both as
``self.rotary_pos_emb(rotary_seq_len, packed_seq=...)``. :class:`EndPromptPositions` is a mixin
placed before such a model class: it swaps in an
:class:`~megatron_endprompt.model.rope.EndPromptRotaryEmbedding` after the model is built and
wraps the public ``forward`` (same signature as both classes') in
:meth:`~megatron_endprompt.model.rope.EndPromptRotaryEmbedding.call_positions`, so the stock
length-only call inside returns the freqs of the batch's positions. No private method is
overridden, no model attribute is flipped, nothing process-wide changes.

``position_ids`` must be passed on *every* stage, including middle and last pipeline stages
where stock ignores them; a missing or wrongly sized ``position_ids`` is an error, never a
silent fallback to contiguous positions (a length-only RoPE call outside this forward raises
too). Under context parallelism they are this rank's zig-zag slice and are used as is.
Inference (``inference_context`` given) keeps stock behaviour with contiguous positions, divided
by the same PI factor.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from megatron_endprompt.model.rope import EndPromptRotaryEmbedding

__all__ = ["EndPromptPositions"]


class EndPromptPositions:
    """Mixin: RoPE from the ``position_ids`` given to ``forward``, on every pipeline stage.

    Use as ``class M(EndPromptPositions, MegatronModel)``; ``M.__init__`` builds the stock model,
    calls :meth:`_check_rope_config` and sets ``self.rotary_pos_emb`` to its
    :class:`~megatron_endprompt.model.rope.EndPromptRotaryEmbedding`. The module holds no
    parameter or buffer, so checkpoint keys stay the stock model's.
    """

    rotary_pos_emb: EndPromptRotaryEmbedding

    def _check_rope_config(self) -> None:
        """Refuse what EndPrompt RoPE cannot serve: non-RoPE position embeddings, multi-latent
        attention (its own decoupled RoPE), single-QKV fused RoPE."""
        config = self.config
        if self.position_embedding_type != "rope" or config.multi_latent_attention:
            raise ValueError(
                "EndPrompt needs position_embedding_type='rope' without multi-latent attention "
                f"(got {self.position_embedding_type!r}, "
                f"multi_latent_attention={config.multi_latent_attention})")
        if getattr(config, "fused_single_qkv_rope", False):
            raise ValueError(
                "fused_single_qkv_rope takes only [S, 1, 1, D] freqs; EndPrompt batches with "
                "differing layouts need per-row RoPE: turn it off")

    def _endprompt_rotary(self, stock: dict, *, pi_factor: float | None, yarn: Any,
                          rope_scaling: bool, rope_scaling_factor: float,
                          cp_group: Any) -> EndPromptRotaryEmbedding:
        """The model's RoPE module, built from the arguments the stock model built its own from
        (``stock``: the stock ``__init__``'s bound arguments) plus ``pi_factor`` / ``yarn``;
        ``cp_group``: the stock module's context-parallel group (where the stock model keeps
        it differs between model classes and Megatron-Core versions)."""
        return EndPromptRotaryEmbedding(
            kv_channels=self.config.kv_channels,
            rotary_percent=stock["rotary_percent"],
            rotary_interleaved=self.config.rotary_interleaved,
            pi_factor=pi_factor,
            seq_len_interpolation_factor=stock["seq_len_interpolation_factor"],
            rotary_base=stock["rotary_base"],
            rope_scaling=rope_scaling,
            rope_scaling_factor=rope_scaling_factor,
            use_cpu_initialization=self.config.use_cpu_initialization,
            cp_group=cp_group,
            yarn=yarn,
        )

    @property
    def pi_factor(self) -> float:
        """``s``: position ids are divided by it before RoPE."""
        return self.rotary_pos_emb.pi_factor

    def forward(self, input_ids: Tensor | None, position_ids: Tensor | None,
                attention_mask: Tensor | None, decoder_input: Tensor | None = None,
                labels: Tensor | None = None, inference_context: Any = None, *args: Any,
                inference_params: Any = None, **kwargs: Any) -> Tensor:
        """The stock ``forward`` (same arguments), with RoPE from ``position_ids [B, S]``
        (this CP rank's slice); contiguous positions under inference."""
        inference = inference_context is not None or inference_params is not None
        if not inference and position_ids is not None:
            self._check_batch(position_ids, input_ids, decoder_input)
        with self.rotary_pos_emb.call_positions(position_ids, contiguous=inference):
            return super().forward(input_ids, position_ids, attention_mask, decoder_input,
                                   labels, inference_context, *args,
                                   inference_params=inference_params, **kwargs)

    def _check_batch(self, position_ids: Tensor, input_ids: Tensor | None,
                     decoder_input: Tensor | None) -> None:
        """One positions row, or one per micro-batch row (the sequence length is checked by
        the RoPE module against the length the model asks for)."""
        if input_ids is not None:
            batch = input_ids.shape[0]
        else:
            hidden = decoder_input if decoder_input is not None else self.decoder.input_tensor
            if not isinstance(hidden, Tensor):
                return
            batch = hidden.size(1)
        if position_ids.dim() == 2 and position_ids.shape[0] not in (1, batch):
            raise ValueError(f"position_ids batch {position_ids.shape[0]} != micro-batch {batch}")
