"""The HF model families the converter knows, and what each adds to the Llama layout.

All are RMSNorm / SwiGLU / RoPE / GQA decoders with the same tensor names; they differ in two
attention details, each one Megatron flag:

* Qwen2 / Qwen2.5 (``model_type: qwen2``): biases on q/k/v (HF always builds them) ->
  Megatron ``--add-qkv-bias`` (``o_proj`` and the MLP stay bias-free: ``--disable-bias-linear``);
* Qwen3 (``model_type: qwen3``): RMSNorm over each head's channels of q and k (HF ``q_norm`` /
  ``k_norm``, before RoPE) -> Megatron ``--qk-layernorm`` (``q_layernorm`` / ``k_layernorm`` on
  the per-head tensors, before RoPE, with ``--norm-epsilon``).

A checkpoint records its HF ``model_type`` (``endprompt_hf_config``); one without the record
(a model trained from scratch) gets its family from these flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megatron_endprompt.errors import UserError

__all__ = ["FAMILIES", "ModelFamily", "family_for_model_type", "family_from_megatron_args"]


@dataclass(frozen=True, kw_only=True)
class ModelFamily:
    """One HF ``model_type`` and its attention details."""

    model_type: str
    """HF ``config.json`` ``model_type``."""
    architecture: str
    """HF ``architectures`` entry (the ``*ForCausalLM`` class)."""
    config_class: str
    """``transformers`` config class that writes and validates the exported ``config.json``."""
    qkv_bias: bool = False
    """q/k/v projections carry biases (Megatron ``--add-qkv-bias``)."""
    qk_norm: bool = False
    """Per-head RMSNorm on q and k (Megatron ``--qk-layernorm``)."""

    def megatron_flags(self) -> list[str]:
        """The Megatron flags beyond the Llama layout's."""
        return (["--add-qkv-bias"] if self.qkv_bias else []) + \
            (["--qk-layernorm"] if self.qk_norm else [])

    def hf_config_fields(self) -> dict[str, Any]:
        """Fields the exported config pins for this family (no biases beyond q/k/v, full
        causal attention)."""
        if self.model_type in ("mistral",):
            return {"sliding_window": None}
        if self.model_type == "qwen2":
            return {"use_sliding_window": False}
        if self.model_type == "qwen3":
            return {"use_sliding_window": False, "attention_bias": False}
        return {"attention_bias": False, "mlp_bias": False}


#: Known families by ``model_type``.
FAMILIES: dict[str, ModelFamily] = {f.model_type: f for f in (
    ModelFamily(model_type="llama", architecture="LlamaForCausalLM", config_class="LlamaConfig"),
    ModelFamily(model_type="mistral", architecture="MistralForCausalLM",
                config_class="MistralConfig"),
    ModelFamily(model_type="qwen2", architecture="Qwen2ForCausalLM", config_class="Qwen2Config",
                qkv_bias=True),
    ModelFamily(model_type="qwen3", architecture="Qwen3ForCausalLM", config_class="Qwen3Config",
                qk_norm=True),
)}


def family_for_model_type(model_type: Any, *, where: str) -> ModelFamily:
    """The family of an HF ``model_type``; :class:`UserError` naming ``where`` otherwise."""
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise UserError(f"{where}: model_type {model_type!r} is not supported; supported: "
                        f"{', '.join(FAMILIES)}")
    return family


def family_from_megatron_args(args: Any) -> ModelFamily:
    """The family of a checkpoint's saved ``args``: the recorded HF ``model_type`` when its
    flags agree with the args, else the one the flags imply (Llama without either)."""
    qkv_bias = bool(getattr(args, "add_qkv_bias", False))
    qk_norm = bool(getattr(args, "qk_layernorm", False))
    recorded = (getattr(args, "endprompt_hf_config", None) or {}).get("model_type")
    family = FAMILIES.get(recorded)
    if family is not None and (family.qkv_bias, family.qk_norm) == (qkv_bias, qk_norm):
        return family
    for candidate in FAMILIES.values():
        if (candidate.qkv_bias, candidate.qk_norm) == (qkv_bias, qk_norm):
            return candidate
    raise UserError("the checkpoint's model has both --add-qkv-bias and --qk-layernorm; no "
                    f"supported HF family ({', '.join(FAMILIES)}) has both")
