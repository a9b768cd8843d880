"""Config translation: HF ``config.json`` (Llama, Mistral, Qwen2/2.5, Qwen3) <-> Megatron-LM
arguments.

HF -> Megatron: :func:`read_hf_config` validates an HF directory's config (RMSNorm, SwiGLU, RoPE,
no biases beyond Qwen2's q/k/v ones; the families are :mod:`.families`) into an
:class:`HFModelSpec`; :func:`megatron_flags` gives the
Megatron command-line flags that build the same model (the converter prints them and records
them in the checkpoint's saved ``args``).

Megatron -> HF: :func:`spec_from_megatron_args` reads a checkpoint's saved ``args`` back into an
:class:`HFModelSpec`, and :func:`hf_config_dict` writes the exported ``config.json``:
``max_position_embeddings = L``, RoPE base kept, and linear position interpolation by ``s``
written twice — ``rope_parameters {"rope_type": "linear", "factor": s, "rope_theta": base}``
(transformers >= 5) and the legacy ``rope_scaling {"type": "linear", "rope_type": "linear",
"factor": s}`` plus top-level ``rope_theta`` (transformers 4.x, vLLM). The two forms carry the same
values, so whichever a reader prefers it gets the same RoPE. A run trained with
``--endprompt-rope-scaling yarn|ntk-by-parts`` exports ``rope_type: yarn`` instead (factor ``s``,
``original_max_position_embeddings = L0``, its betas; ``attention_factor: 1.0`` for
NTK-by-parts), again in both forms.
"""

from __future__ import annotations

import json
import os
from argparse import Namespace
from dataclasses import dataclass, field, replace
from typing import Any

from megatron_endprompt.conversion.families import (
    FAMILIES,
    family_for_model_type,
    family_from_megatron_args,
)
from megatron_endprompt.errors import UserError
from megatron_endprompt.model.yarn import YarnScaling, yarn_from_megatron_args
from megatron_endprompt.shape import ModelShape

__all__ = [
    "HFModelSpec",
    "hf_config_dict",
    "megatron_flags",
    "read_hf_config",
    "spec_from_megatron_args",
]

#: Megatron's Llama-3.1 RoPE scaling has fixed parameters apart from the factor.
MEGATRON_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}


@dataclass(frozen=True, kw_only=True)
class HFModelSpec(ModelShape):
    """A Llama-layout model's architecture, the common ground of both directions: its shape
    plus what ``config.json`` needs beyond it."""

    rms_norm_eps: float
    """RMSNorm epsilon (Megatron ``--norm-epsilon``)."""
    rope_theta: float
    """RoPE base (Megatron ``--rotary-base``)."""
    max_position_embeddings: int
    """The window ``config.json`` states."""
    llama3_rope_factor: float | None = None
    """Llama-3.1 ``rope_type: llama3`` scaling (Megatron ``--use-rope-scaling``); ``None``
    without."""
    dtype: str = "float32"
    """``torch_dtype`` of the weights."""
    model_type: str = "llama"
    """HF ``model_type`` (one of :data:`.families.FAMILIES`)."""
    yarn: YarnScaling | None = None
    """YaRN / NTK-by-parts RoPE the checkpoint was trained with (its factor is the run's
    ``s``); ``None``: linear PI."""
    extra: dict[str, Any] = field(default_factory=dict)
    """HF config fields carried over unchanged on export (token ids, ``initializer_range``...)."""


def _load_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise UserError(f"{path} not found: not a Hugging Face model directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path} holds a JSON {type(doc).__name__}, not an object of config "
                        "fields; give the model's own config.json")
    return doc


def _check_positive(path: str, spec: HFModelSpec, raw: dict[str, Any]) -> None:
    """Refuse non-positive or non-finite scalars transformers accepts (a negative
    ``rope_theta`` or a NaN ``rms_norm_eps`` converts into a model that computes NaN), also in
    the top-level ``rope_theta`` transformers 5 ignores beside ``rope_parameters`` (4.x and
    vLLM read it), and the two disagreeing."""
    import math

    values = {"rope_theta": spec.rope_theta, "rms_norm_eps": spec.rms_norm_eps,
              "max_position_embeddings": spec.max_position_embeddings}
    if "rope_theta" in raw:
        values["rope_theta (top level)"] = raw["rope_theta"]
    if spec.llama3_rope_factor is not None:
        values["rope_scaling.factor"] = spec.llama3_rope_factor
    for name, value in values.items():
        if isinstance(value, bool) or not (isinstance(value, (int, float))
                                           and math.isfinite(value) and value > 0):
            raise UserError(f"{path}: {name}={value} must be a positive finite number; fix it "
                            "in config.json")
    if "rope_theta" in raw and float(raw["rope_theta"]) != spec.rope_theta:
        raise UserError(f"{path}: rope_theta={raw['rope_theta']} but rope_parameters.rope_theta"
                        f"={spec.rope_theta:g} (transformers 4.x reads the first, 5.x the "
                        "second); make them equal")


def read_hf_config(hf_dir: str) -> HFModelSpec:
    """Validate ``hf_dir/config.json`` as a model of a known family (:mod:`.families`). Raises
    :class:`UserError`."""
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isdir(hf_dir):
        raise UserError(f"--hf-dir {hf_dir}: no such directory")
    raw = _load_json(path)
    model_type = raw.get("model_type")
    archs = raw.get("architectures") or []
    family = family_for_model_type(model_type, where=f"{path} (architectures {archs})")
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(hf_dir)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the user's config
        raise UserError(f"{path}: transformers cannot read it ({exc})") from None
    for flag in ("attention_bias", "mlp_bias"):
        if getattr(cfg, flag, False):
            raise UserError(f"{path}: {flag}=true is not supported (biases only on Qwen2's "
                            "q/k/v); set it false or use another checkpoint")
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise UserError(f"{path}: hidden_act {cfg.hidden_act!r}; Llama uses silu (SwiGLU)")
    window = getattr(cfg, "sliding_window", None)
    if window is not None and window < cfg.max_position_embeddings:
        raise UserError(f"{path}: sliding_window={window} attention is not supported by the "
                        "Megatron model (only full causal attention)")
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    llama3 = None
    if rope_type == "llama3":
        for key, want in MEGATRON_LLAMA3_ROPE.items():
            if float(rope.get(key, want)) != float(want):
                raise UserError(f"{path}: llama3 RoPE scaling with {key}={rope.get(key)}; "
                                f"Megatron's --use-rope-scaling fixes it to {want}")
        llama3 = float(rope["factor"])
    elif rope_type != "default":
        raise UserError(f"{path}: RoPE type {rope_type!r} is not supported on the way in "
                        "(default and llama3 are)")
    try:
        spec = _hf_spec(cfg, raw, rope, llama3, model_type)
        _check_positive(path, spec, raw)
        return replace(spec, qkv_bias=family.qkv_bias, qk_norm=family.qk_norm)
    # the shape's own checks (ModelShape): one line naming the file
    except (ValueError, TypeError) as exc:
        raise UserError(f"{path}: {exc}") from None


def _hf_spec(cfg: Any, raw: dict[str, Any], rope: dict[str, Any], llama3: float | None,
             model_type: str) -> HFModelSpec:
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or (cfg.hidden_size // heads if heads else 0)
    dtype = str(getattr(cfg, "dtype", None) or raw.get("torch_dtype") or "float32")
    extra = {k: raw[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id",
                                 "initializer_range") if k in raw}
    return HFModelSpec(
        num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size,
        ffn_hidden_size=cfg.intermediate_size, num_attention_heads=heads,
        num_query_groups=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=head_dim, vocab_size=cfg.vocab_size, rms_norm_eps=float(cfg.rms_norm_eps),
        rope_theta=float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))),
        max_position_embeddings=cfg.max_position_embeddings,
        tied=bool(getattr(cfg, "tie_word_embeddings", False)), llama3_rope_factor=llama3,
        dtype=dtype.replace("torch.", ""), model_type=model_type, extra=extra,
    )


def _rotary_base(theta: float) -> str:
    """Megatron's ``--rotary-base`` is an integer: ``1000000`` for Qwen's 1e6 (``f"{1e6:g}"``
    would be ``1e+06``, which Megatron's parser refuses)."""
    if not float(theta).is_integer():
        raise UserError(f"rope_theta {theta} is not an integer; Megatron's --rotary-base takes "
                        "integers only")
    return str(int(theta))


def megatron_flags(spec: HFModelSpec, *, tensor_parallel_size: int = 1,
                   pipeline_parallel_size: int = 1,
                   make_vocab_size_divisible_by: int = 128) -> list[str]:
    """Megatron-LM flags building ``spec``'s architecture (what training must pass)."""
    flags = [
        "--num-layers", str(spec.num_layers), "--hidden-size", str(spec.hidden_size),
        "--ffn-hidden-size", str(spec.ffn_hidden_size),
        "--num-attention-heads", str(spec.num_attention_heads),
        "--kv-channels", str(spec.head_dim),
        "--position-embedding-type", "rope", "--rotary-base", _rotary_base(spec.rope_theta),
        "--normalization", "RMSNorm", "--norm-epsilon", repr(spec.rms_norm_eps),
        "--swiglu", "--disable-bias-linear",
        "--max-position-embeddings", str(spec.max_position_embeddings),
        "--make-vocab-size-divisible-by", str(make_vocab_size_divisible_by),
        "--tensor-model-parallel-size", str(tensor_parallel_size),
        "--pipeline-model-parallel-size", str(pipeline_parallel_size),
    ]
    if spec.num_query_groups != spec.num_attention_heads:
        flags += ["--group-query-attention", "--num-query-groups", str(spec.num_query_groups)]
    if not spec.tied:
        flags.append("--untie-embeddings-and-output-weights")
    if spec.llama3_rope_factor is not None:
        flags += ["--use-rope-scaling", "--rope-scaling-factor", f"{spec.llama3_rope_factor:g}"]
    flags += (["--add-qkv-bias"] if spec.qkv_bias else []) + \
        (["--qk-layernorm"] if spec.qk_norm else [])
    return flags


def megatron_args(spec: HFModelSpec, flags: list[str], *, padded_vocab_size: int) -> Namespace:
    """A Megatron-LM argument namespace for ``flags`` (Megatron's own parser and defaults),
    with the derived fields a saved checkpoint carries, plus ``endprompt_hf_config`` (the source
    config, so an export of an untrained conversion restores it exactly)."""
    import argparse

    import torch
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    args = parser.parse_args(flags + ["--ckpt-format", "torch_dist"])
    args.padded_vocab_size = padded_vocab_size
    args.world_size = 1
    args.data_parallel_size = 1
    args.params_dtype = getattr(torch, spec.dtype, torch.float32)
    args.iteration = 0
    args.consumed_train_samples = 0
    args.consumed_valid_samples = 0
    args.endprompt_hf_config = {
        "model_type": spec.model_type, "vocab_size": spec.vocab_size, "dtype": spec.dtype,
        "max_position_embeddings": spec.max_position_embeddings, **spec.extra,
    }
    return args


def spec_from_megatron_args(args: Any) -> HFModelSpec:
    """The architecture recorded in a checkpoint's ``args``. Raises :class:`UserError` for
    models that are not Llama-layout."""
    problems = []
    if getattr(args, "normalization", "LayerNorm") != "RMSNorm":
        problems.append(f"normalization={getattr(args, 'normalization', None)}")
    if not getattr(args, "swiglu", False):
        problems.append("no --swiglu")
    if getattr(args, "add_bias_linear", True):
        problems.append("linear biases (beyond --add-qkv-bias)")
    if getattr(args, "position_embedding_type", "rope") != "rope":
        problems.append(f"position_embedding_type={args.position_embedding_type}")
    if getattr(args, "num_experts", None):
        problems.append("MoE")
    if float(getattr(args, "rotary_percent", 1.0)) != 1.0:
        problems.append(f"rotary_percent={args.rotary_percent}")
    if getattr(args, "rotary_interleaved", False):
        problems.append("rotary_interleaved")
    if getattr(args, "apply_layernorm_1p", False):
        problems.append("apply_layernorm_1p")
    if problems:
        raise UserError("the checkpoint's model is not a Llama layout (" + ", ".join(problems)
                        + "); only RMSNorm/SwiGLU/RoPE models export to HF ("
                        + ", ".join(FAMILIES) + ")")
    family = family_from_megatron_args(args)
    try:
        yarn = yarn_from_megatron_args(args)
    except ValueError as exc:
        raise UserError(f"the checkpoint's saved args: {exc}") from None
    heads = args.num_attention_heads
    groups = args.num_query_groups if getattr(args, "group_query_attention", False) else heads
    source = dict(getattr(args, "endprompt_hf_config", None) or {})
    dtype = source.get("dtype") or str(getattr(args, "params_dtype", "float32"))
    return HFModelSpec(
        num_layers=args.num_layers, hidden_size=args.hidden_size,
        ffn_hidden_size=args.ffn_hidden_size, num_attention_heads=heads,
        num_query_groups=groups or heads,
        head_dim=args.kv_channels or args.hidden_size // heads,
        vocab_size=int(source.get("vocab_size") or args.padded_vocab_size),
        rms_norm_eps=float(args.layernorm_epsilon), rope_theta=float(args.rotary_base),
        max_position_embeddings=int(source.get("max_position_embeddings")
                                    or args.max_position_embeddings),
        tied=not args.untie_embeddings_and_output_weights,
        llama3_rope_factor=(float(args.rope_scaling_factor)
                            if getattr(args, "use_rope_scaling", False) else None),
        dtype=dtype.replace("torch.", ""), model_type=family.model_type,
        qkv_bias=family.qkv_bias, qk_norm=family.qk_norm, yarn=yarn,
        extra={k: v for k, v in source.items()
               if k not in ("model_type", "vocab_size", "dtype", "max_position_embeddings")},
    )


def _yarn_parameters(yarn: YarnScaling, *, target_length: int, pi_factor: float
                     ) -> dict[str, Any]:
    """HF ``rope_type: yarn`` fields (without ``rope_theta``) for a YaRN run exported at
    ``s = pi_factor``. Readers differ on where the factor comes from (``factor``, or
    ``max_position_embeddings / original_max_position_embeddings``): both must agree."""
    L0 = yarn.original_max_position_embeddings
    if float(target_length) / L0 != float(pi_factor):
        raise UserError(f"YaRN export with factor s={pi_factor:g} but L/L0 = {target_length}/{L0}"
                        f" = {target_length / L0:g}; HF readers take the factor from either, so "
                        f"pass --target-length {int(round(pi_factor * L0))} (= s * L0) or "
                        f"--pi-factor {target_length / L0:g}")
    fields: dict[str, Any] = {"rope_type": "yarn", "factor": float(pi_factor),
                              "original_max_position_embeddings": L0,
                              "beta_fast": float(yarn.beta_fast),
                              "beta_slow": float(yarn.beta_slow)}
    if not yarn.truncate:
        fields["truncate"] = False
    if not yarn.attention_scaling:  # NTK-by-parts: YaRN's frequencies, no temperature
        fields["attention_factor"] = 1.0
    return fields


def _rope_parameters(spec: HFModelSpec, *, target_length: int, pi_factor: float
                     ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(rope_parameters, legacy rope_scaling or None)`` of the exported config."""
    theta = spec.rope_theta
    if spec.llama3_rope_factor is not None:
        if pi_factor != 1.0:
            raise UserError(
                f"the model uses Llama-3.1 RoPE scaling and PI factor s={pi_factor:g}; HF "
                "configs cannot stack linear interpolation on llama3 scaling")
        scaling = {"rope_type": "llama3", "factor": spec.llama3_rope_factor,
                   **MEGATRON_LLAMA3_ROPE}
        return {**scaling, "rope_theta": theta}, {"type": "llama3", **scaling}
    if pi_factor == 1.0:  # YaRN with factor 1 is plain RoPE too
        return {"rope_type": "default", "rope_theta": theta}, None
    if spec.yarn is not None:
        scaling = _yarn_parameters(spec.yarn, target_length=target_length, pi_factor=pi_factor)
        return {**scaling, "rope_theta": theta}, {"type": "yarn", **scaling}
    return ({"rope_type": "linear", "factor": float(pi_factor), "rope_theta": theta},
            {"type": "linear", "rope_type": "linear", "factor": float(pi_factor)})


def hf_config_dict(spec: HFModelSpec, *, target_length: int, pi_factor: float,
                   vocab_size: int | None = None) -> dict[str, Any]:
    """The exported ``config.json``, made by the family's config class (``LlamaConfig``,
    ``Qwen2Config``..., which validate the fields) plus the legacy fields transformers 4.x
    reads: ``max_position_embeddings = target_length``, RoPE base kept, the run's scaling by
    ``pi_factor`` (linear, or YaRN) in both forms."""
    import transformers

    if vocab_size is not None:
        spec = replace(spec, vocab_size=vocab_size)
    theta = spec.rope_theta
    rope_parameters, legacy = _rope_parameters(spec, target_length=target_length,
                                               pi_factor=pi_factor)
    family = family_for_model_type(spec.model_type, where="the checkpoint's HF model_type")
    fields: dict[str, Any] = {
        "architectures": [family.architecture],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.ffn_hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_query_groups,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": spec.rms_norm_eps,
        "max_position_embeddings": int(target_length),
        "rope_parameters": rope_parameters,
        "tie_word_embeddings": spec.tied,
        "attention_dropout": 0.0,
        "use_cache": True,
        "dtype": spec.dtype,
        **family.hf_config_fields(),
        **spec.extra,
    }
    config_class = getattr(transformers, family.config_class)
    config = config_class(**fields).to_diff_dict()  # transformers fills and checks the fields
    # what transformers 4.x (and vLLM) read: top-level rope_theta, legacy rope_scaling
    config.update(max_position_embeddings=int(target_length), rope_theta=theta,
                  rope_parameters=rope_parameters, torch_dtype=spec.dtype, dtype=spec.dtype)
    if legacy is not None:
        config["rope_scaling"] = legacy
    if family.model_type != "llama":  # full causal attention, stated for every reader
        config["sliding_window"] = None
    return config
