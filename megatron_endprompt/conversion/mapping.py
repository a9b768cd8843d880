"""The Hugging Face <-> Megatron-Core weight mapping (Llama layout, plus Qwen2's QKV biases and
Qwen3's per-head QK norms), declared as data.

One :class:`WeightMapping` per Megatron tensor: its name in the Megatron module ``state_dict``
(local layer spec), its name in the Transformer Engine layer spec (which is also the name under
which *both* specs store it in a ``torch_dist`` checkpoint: the local spec maps
``input_layernorm.`` / ``pre_mlp_layernorm.`` onto TE's names in ``sharded_state_dict``), the HF
tensor name(s) and the :class:`~.transforms.Transform` between them (fused QKV per query group,
gate/up concatenation, vocabulary padding, identity, norm), which owns the shapes and both
directions. ``{layer}`` stands for the decoder layer index.

Both directions use the same table and invertible transforms, so a round trip is bit-exact.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from torch import Tensor

from megatron_endprompt.conversion.transforms import (
    Dims,
    GateUpConcat,
    HeadNorm,
    Identity,
    Norm,
    QKVBiasFusedPerGroup,
    QKVFusedPerGroup,
    Transform,
    VocabPad,
)
from megatron_endprompt.shape import ModelShape

__all__ = ["LLAMA_MAPPINGS", "QKV_BIAS_MAPPINGS", "QK_NORM_MAPPINGS", "Dims", "WeightMapping",
           "expand", "hf_names", "mappings_for", "model_mappings"]


@dataclass(frozen=True, kw_only=True)
class WeightMapping:
    """One Megatron tensor and the HF tensor(s) it is made of."""

    megatron: str
    """Module ``state_dict`` name with the local layer spec."""
    hf: tuple[str, ...]
    """HF name patterns, in the order ``transform`` takes them."""
    transform: Transform
    """Shapes and both directions."""
    te: str | None = None
    """Name with the TE layer spec (and in ``torch_dist`` checkpoints); ``None``: the same."""
    per_layer: bool = False
    """The names contain ``{layer}``."""
    untied_only: bool = False
    """Absent when input and output embeddings are tied."""

    def megatron_name(self, *, layer: int | None = None, te_spec: bool = False) -> str:
        """Megatron module name (local spec unless ``te_spec``) for this layer."""
        name = self.te if te_spec and self.te else self.megatron
        return name.format(layer=layer) if self.per_layer else name

    def hf_names(self, *, layer: int | None = None) -> tuple[str, ...]:
        """HF tensor names for this layer."""
        return tuple(n.format(layer=layer) if self.per_layer else n for n in self.hf)

    def checkpoint_key(self) -> str:
        """Key of the (layer-stacked) global tensor in a ``torch_dist`` checkpoint."""
        name = self.te or self.megatron
        return name.replace("decoder.layers.{layer}.", "decoder.layers.")

    def hf_shapes(self, dims: Dims) -> tuple[tuple[int, ...], ...]:
        """Expected shapes of the HF tensors."""
        return self.transform.hf_shapes(dims)

    def megatron_shape(self, dims: Dims) -> tuple[int, ...]:
        """Shape of the Megatron tensor (one layer)."""
        return self.transform.megatron_shape(dims)

    def to_megatron(self, hf: Sequence[Tensor], dims: Dims) -> Tensor:
        """HF tensors (in ``hf`` order) -> the Megatron tensor."""
        return self.transform.to_megatron(hf, dims)

    def to_hf(self, tensor: Tensor, dims: Dims) -> tuple[Tensor, ...]:
        """The Megatron tensor -> HF tensors, in ``hf`` order."""
        return self.transform.to_hf(tensor, dims)


_L = "decoder.layers.{layer}."
_H = "model.layers.{layer}."

#: The Llama / Mistral mapping (RMSNorm, SwiGLU, RoPE, GQA, no biases).
LLAMA_MAPPINGS: tuple[WeightMapping, ...] = (
    WeightMapping(megatron="embedding.word_embeddings.weight",
                  hf=("model.embed_tokens.weight",), transform=VocabPad()),
    WeightMapping(megatron=_L + "input_layernorm.weight",
                  te=_L + "self_attention.linear_qkv.layer_norm_weight",
                  hf=(_H + "input_layernorm.weight",), transform=Norm(),
                  per_layer=True),
    WeightMapping(megatron=_L + "self_attention.linear_qkv.weight",
                  hf=(_H + "self_attn.q_proj.weight", _H + "self_attn.k_proj.weight",
                      _H + "self_attn.v_proj.weight"),
                  transform=QKVFusedPerGroup(), per_layer=True),
    WeightMapping(megatron=_L + "self_attention.linear_proj.weight",
                  hf=(_H + "self_attn.o_proj.weight",),
                  transform=Identity(("hidden_size", "query_width")),
                  per_layer=True),
    WeightMapping(megatron=_L + "pre_mlp_layernorm.weight",
                  te=_L + "mlp.linear_fc1.layer_norm_weight",
                  hf=(_H + "post_attention_layernorm.weight",), transform=Norm(),
                  per_layer=True),
    WeightMapping(megatron=_L + "mlp.linear_fc1.weight",
                  hf=(_H + "mlp.gate_proj.weight", _H + "mlp.up_proj.weight"),
                  transform=GateUpConcat(), per_layer=True),
    WeightMapping(megatron=_L + "mlp.linear_fc2.weight",
                  hf=(_H + "mlp.down_proj.weight",),
                  transform=Identity(("hidden_size", "ffn_hidden_size")),
                  per_layer=True),
    WeightMapping(megatron="decoder.final_layernorm.weight", hf=("model.norm.weight",),
                  transform=Norm()),
    WeightMapping(megatron="output_layer.weight", hf=("lm_head.weight",),
                  transform=VocabPad(), untied_only=True),
)


#: Qwen2 / Qwen2.5: biases on q/k/v (Megatron ``--add-qkv-bias``; ``o_proj`` and the MLP have
#: none, so ``--disable-bias-linear`` stays).
QKV_BIAS_MAPPINGS: tuple[WeightMapping, ...] = (
    WeightMapping(megatron=_L + "self_attention.linear_qkv.bias",
                  hf=(_H + "self_attn.q_proj.bias", _H + "self_attn.k_proj.bias",
                      _H + "self_attn.v_proj.bias"),
                  transform=QKVBiasFusedPerGroup(), per_layer=True),
)

#: Qwen3: RMSNorm over each head's ``d`` channels of q and k (Megatron ``--qk-layernorm``).
QK_NORM_MAPPINGS: tuple[WeightMapping, ...] = (
    WeightMapping(megatron=_L + "self_attention.q_layernorm.weight",
                  hf=(_H + "self_attn.q_norm.weight",), transform=HeadNorm(), per_layer=True),
    WeightMapping(megatron=_L + "self_attention.k_layernorm.weight",
                  hf=(_H + "self_attn.k_norm.weight",), transform=HeadNorm(), per_layer=True),
)


def model_mappings(*, qkv_bias: bool = False, qk_norm: bool = False
                   ) -> tuple[WeightMapping, ...]:
    """The mapping of a Llama-layout model with Qwen2's QKV biases and/or Qwen3's QK norms
    (their entries follow ``linear_qkv``, the order HF files list them in)."""
    extra = (QKV_BIAS_MAPPINGS if qkv_bias else ()) + (QK_NORM_MAPPINGS if qk_norm else ())
    qkv = next(i for i, m in enumerate(LLAMA_MAPPINGS)
               if m.megatron.endswith("linear_qkv.weight"))
    return LLAMA_MAPPINGS[:qkv + 1] + extra + LLAMA_MAPPINGS[qkv + 1:]


def mappings_for(shape: ModelShape) -> tuple[WeightMapping, ...]:
    """The mapping of a model of this shape (its ``qkv_bias`` / ``qk_norm`` decide)."""
    return model_mappings(qkv_bias=shape.qkv_bias, qk_norm=shape.qk_norm)


def expand(mappings: Sequence[WeightMapping], dims: Dims
           ) -> Iterator[tuple[WeightMapping, int | None]]:
    """Every ``(mapping, layer)`` pair of a model (layer ``None`` for non-layer tensors), in
    HF file order: embedding, layer 0..N-1, final norm, output layer."""
    for m in mappings:
        if m.untied_only and dims.tied:
            continue
        if not m.per_layer:
            if m.megatron.startswith("embedding"):
                yield m, None
    for layer in range(dims.num_layers):
        for m in mappings:
            if m.per_layer:
                yield m, layer
    for m in mappings:
        if not m.per_layer and not m.megatron.startswith("embedding"):
            if not (m.untied_only and dims.tied):
                yield m, None


def hf_names(mappings: Sequence[WeightMapping], dims: Dims) -> list[str]:
    """All HF tensor names the model needs."""
    return [n for m, layer in expand(mappings, dims) for n in m.hf_names(layer=layer)]
