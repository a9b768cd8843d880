"""A ``HybridModel`` stack spec from a GPT layer spec: Llama-style ``*-*-...`` patterns anywhere.

Megatron-Core's hybrid stack specs (``hybrid_layer_specs``) are Transformer Engine only, and
``HybridStack`` builds its final norm as ``TENorm`` whatever its layers are, so a hybrid model
cannot be built where TE cannot run (the CPU runtime, conversion, unit tests).
:func:`hybrid_stack_spec_from_layer_spec` splits one GPT layer spec (Megatron's local or TE
spec) into the hybrid stack's two layer kinds — ``*`` the attention half (input norm, self
attention, residual), ``-`` the MLP half (pre-MLP norm, MLP, residual), each with its share of
the layer spec's checkpoint-key map — so pattern ``"*-" * n`` is the same network as an
``n``-layer ``GPTModel`` with that layer spec (``decoder.layers.{i}`` attention weights at
``decoder.layers.{2i}``, MLP weights at ``decoder.layers.{2i+1}``). With a separate input norm
(the local spec) the final norm is that norm class (:class:`LayerNormHybridStack`); with a
norm fused into the first linear (TE's spec) the stack is Megatron's own, ``TENorm`` included.
Checkpoint keys are stock: ``decoder.final_norm.weight``.
"""

from __future__ import annotations

from typing import Any

from megatron.core.models.hybrid.hybrid_block import HybridStack, HybridStackSubmodules
from megatron.core.ssm.mlp_layer import MLPLayer
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from megatron.core.transformer.transformer_layer import (
    BaseTransformerLayer,
    TransformerLayer,
    TransformerLayerSubmodules,
)

__all__ = ["LayerNormHybridStack", "hybrid_stack_spec_from_layer_spec", "is_layer_spec"]


class LayerNormHybridStack(HybridStack):
    """``HybridStack`` whose final norm is ``final_norm`` (the layers' norm class), not
    ``TENorm``. Same forward, same ``final_norm`` attribute and checkpoint key."""

    def __init__(self, config: Any, submodules: HybridStackSubmodules, *args: Any,
                 final_norm: Any, post_layer_norm: bool = True, **kwargs: Any) -> None:
        super().__init__(config, submodules, *args, post_layer_norm=False, **kwargs)
        self.post_layer_norm = post_layer_norm
        if self.post_process and post_layer_norm:
            self.final_norm = build_module(final_norm, config=config,
                                           hidden_size=config.hidden_size,
                                           eps=config.layernorm_epsilon)


def is_layer_spec(spec: Any) -> bool:
    """Whether ``spec`` is a single transformer-layer spec (what ``GPTModel`` takes)."""
    return (isinstance(spec, ModuleSpec) and isinstance(spec.module, type)
            and issubclass(spec.module, BaseTransformerLayer))


def _split_keys_map(keys_map: dict[str, str], prefixes: tuple[str, ...]) -> dict[str, str]:
    """The entries of a layer's checkpoint-key map that belong to one half of the layer."""
    return {k: v for k, v in keys_map.items() if k.startswith(prefixes)}


def hybrid_stack_spec_from_layer_spec(layer_spec: ModuleSpec) -> ModuleSpec:
    """The ``HybridModel`` stack spec whose ``*`` and ``-`` layers are ``layer_spec``'s
    attention and MLP halves (see the module docstring). Refuses anything but a plain
    ``TransformerLayer`` spec with self attention and a dense MLP."""
    if not is_layer_spec(layer_spec) or layer_spec.module is not TransformerLayer:
        raise ValueError(f"expected a TransformerLayer spec (e.g. get_gpt_layer_local_spec()), "
                         f"got {layer_spec!r}")
    sub = layer_spec.submodules
    if sub.cross_attention is not IdentityOp:
        raise ValueError("a layer spec with cross attention has no hybrid equivalent")
    keys_map = dict(sub.sharded_state_dict_keys_map or {})
    attention = ModuleSpec(module=TransformerLayer, submodules=TransformerLayerSubmodules(
        input_layernorm=sub.input_layernorm, self_attention=sub.self_attention,
        self_attn_bda=sub.self_attn_bda,
        sharded_state_dict_keys_map=_split_keys_map(keys_map, ("input_layernorm.",
                                                               "self_attention."))))
    mlp = ModuleSpec(module=MLPLayer, submodules=TransformerLayerSubmodules(
        pre_mlp_layernorm=sub.pre_mlp_layernorm, mlp=sub.mlp, mlp_bda=sub.mlp_bda,
        sharded_state_dict_keys_map=_split_keys_map(keys_map, ("pre_mlp_layernorm.", "mlp."))))
    stack = HybridStackSubmodules(attention_layer=attention, mlp_layer=mlp)
    if sub.input_layernorm is IdentityOp:  # norm fused into linear_qkv (TE): Megatron's stack
        return ModuleSpec(module=HybridStack, submodules=stack)
    return ModuleSpec(module=LayerNormHybridStack, submodules=stack,
                      params={"final_norm": sub.input_layernorm})
