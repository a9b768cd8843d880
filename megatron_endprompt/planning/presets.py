"""Model and GPU presets of the run planner, and ``--hf-config FILE`` reading.

Model shapes are the published Hugging Face ``config.json`` values of each checkpoint (layers,
hidden, SwiGLU width, heads / KV heads, vocabulary, tied embeddings, original window ``L0``).
GPU figures are the vendor's nominal memory and dense (no sparsity) BF16 tensor-core peak.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from megatron_endprompt.errors import UserError
from megatron_endprompt.shape import ModelShape

__all__ = ["GPU_PRESETS", "MODEL_PRESETS", "GPUSpec", "ModelSpec", "model_from_hf_config"]


@dataclass(frozen=True, kw_only=True)
class ModelSpec(ModelShape):
    """A named model shape with its original context window, for the planner."""

    name: str
    """Preset name, or the ``--hf-config`` file's directory."""
    original_window: int = 8192
    """The model's original context window ``L0`` (for the RoPE interpolation factor)."""

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
            if int(self.original_window) <= 0:
                raise ValueError("original_window must be positive")
        except ValueError as exc:
            raise ValueError(f"model {self.name}: {exc}") from None


def _llama(name: str, layers: int, hidden: int, ffn: int, heads: int, groups: int, vocab: int,
           window: int, tied: bool = False, head_dim: int | None = None,
           qkv_bias: bool = False, qk_norm: bool = False) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn,
                     num_attention_heads=heads, num_query_groups=groups,
                     head_dim=head_dim or hidden // heads, vocab_size=vocab, tied=tied,
                     original_window=window, qkv_bias=qkv_bias, qk_norm=qk_norm)


#: HF ``config.json`` shapes: meta-llama/Meta-Llama-3-8B, -70B, Llama-2-7b-hf,
#: mistralai/Mistral-7B-v0.1 (trained by Megatron with full causal attention), Qwen/Qwen2.5-7B
#: (QKV bias; 7.61B parameters) and Qwen/Qwen3-8B-Base (QK-norm, head_dim 128; 8.2B). The Qwen
#: windows are the native context their model cards state, 32,768 for both (their
#: ``max_position_embeddings`` say 131072 and 40960: the YaRN-extended / generation budget).
MODEL_PRESETS: dict[str, ModelSpec] = {
    "llama3-8b": _llama("llama3-8b", 32, 4096, 14336, 32, 8, 128256, 8192),
    "llama3-70b": _llama("llama3-70b", 80, 8192, 28672, 64, 8, 128256, 8192),
    "llama2-7b": _llama("llama2-7b", 32, 4096, 11008, 32, 32, 32000, 4096),
    "mistral-7b": _llama("mistral-7b", 32, 4096, 14336, 32, 8, 32000, 8192),
    "qwen2.5-7b": _llama("qwen2.5-7b", 28, 3584, 18944, 28, 4, 152064, 32768, qkv_bias=True),
    "qwen3-8b": _llama("qwen3-8b", 36, 4096, 12288, 32, 8, 151936, 32768, head_dim=128,
                       qk_norm=True),
}


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One accelerator as the planner sees it."""

    name: str
    #: nominal device memory, GiB
    memory_gib: float
    #: dense BF16 tensor-core peak, TFLOP/s (the MFU denominator)
    peak_tflops: float


#: Vendor datasheet figures (dense BF16, no structured sparsity).
GPU_PRESETS: dict[str, GPUSpec] = {
    g.name: g for g in (
        GPUSpec(name="h100-80gb", memory_gib=80, peak_tflops=989),    # H100 SXM
        GPUSpec(name="h100-94gb", memory_gib=94, peak_tflops=835),    # H100 NVL
        GPUSpec(name="h200-141gb", memory_gib=141, peak_tflops=989),  # H200 SXM
        GPUSpec(name="a100-80gb", memory_gib=80, peak_tflops=312),
        GPUSpec(name="a100-40gb", memory_gib=40, peak_tflops=312),
        GPUSpec(name="b200-180gb", memory_gib=180, peak_tflops=2250),
    )
}


#: config.json fields that give a mixture-of-experts model's expert count (Mixtral, Qwen-MoE,
#: DeepSeek, DBRX-style spellings).
_EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def _original_window(raw: dict, path: str) -> int:
    """``L0``, read from the config only: ``rope_scaling``'s (or ``rope_parameters``')
    ``original_max_position_embeddings`` when the config is already extended (Llama-3.1,
    YaRN), else ``max_position_embeddings``. Missing, 0 or not a positive integer (``NaN``
    from a hand-edited file): one :class:`UserError` asking for it -- a guessed ``L0`` would put
    a wrong ``s = ceil(L / L0)`` in the launch line."""
    rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    key = "max_position_embeddings"
    if isinstance(rope, dict) and rope.get("original_max_position_embeddings") is not None:
        key = "original_max_position_embeddings"
        value = rope[key]
    else:
        value = raw.get(key)
    if value is None or value == 0:
        raise UserError(f"--hf-config {path}: no {key} (the model's original context window "
                        f"L0, which sets s = ceil(L / L0)); add it to the config, e.g. "
                        f'"{key}": 8192, or plan with --model')
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"--hf-config {path}: {key} {value!r} is not a positive integer; "
                        "set it to the model's original context window L0 (e.g. 8192)")
    return value


def model_from_hf_config(path: str) -> ModelSpec:
    """A :class:`ModelSpec` from an HF ``config.json`` (the file, or a directory holding one).
    Only the shape and ``L0`` are read; Llama-layout fields (``num_hidden_layers``,
    ``intermediate_size``, ``num_key_value_heads``, ``head_dim``...). Raises :class:`UserError`
    naming the file."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise UserError(f"--hf-config {path}: not found; give an HF config.json") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"--hf-config {path}: not a readable JSON file ({exc})") from None
    if not isinstance(raw, dict):
        raise UserError(f"--hf-config {path}: expected a JSON object")
    if isinstance(raw.get("text_config"), dict):  # multimodal wrappers keep the LM here
        raw = {**raw, **raw["text_config"]}
    experts = {k: raw[k] for k in _EXPERT_FIELDS if isinstance(raw.get(k), int) and raw[k] > 1}
    if experts:  # planned as dense it would be off by the experts' weights and routing
        field_, n = next(iter(experts.items()))
        raise UserError(f"--hf-config {path}: a mixture-of-experts model ({field_}={n}, "
                        f"model_type {raw.get('model_type')!r}); the planner's memory and FLOP "
                        "formulas are for dense Llama-layout models, so it does not plan MoE "
                        "runs")
    need = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
            "vocab_size")
    missing = [k for k in need if not isinstance(raw.get(k), int)]
    if missing:
        raise UserError(f"--hf-config {path}: missing integer field(s) {', '.join(missing)}; "
                        "a Llama-layout config.json is needed")
    heads = raw["num_attention_heads"]
    if raw.get("head_dim") is None and heads > 0 and raw["hidden_size"] % heads:
        raise UserError(f"--hf-config {path}: hidden_size {raw['hidden_size']} is not divisible "
                        f"by num_attention_heads {heads} and no head_dim is given (Megatron "
                        "asserts the same); fix hidden_size or num_attention_heads, or give "
                        "head_dim")
    window = _original_window(raw, path)
    try:
        return ModelSpec(
            name=os.path.basename(os.path.dirname(os.path.abspath(path))) or "hf-config",
            num_layers=raw["num_hidden_layers"], hidden_size=raw["hidden_size"],
            ffn_hidden_size=raw["intermediate_size"], num_attention_heads=heads,
            num_query_groups=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            vocab_size=raw["vocab_size"], tied=bool(raw.get("tie_word_embeddings", False)),
            original_window=window, qkv_bias=raw.get("model_type") == "qwen2",
            qk_norm=raw.get("model_type") == "qwen3")
    except ValueError as exc:
        raise UserError(f"--hf-config {path}: {exc}") from None
