"""HF Llama / Mistral / Qwen2 / Qwen3 directory -> Megatron-Core ``torch_dist`` checkpoint that
``pretrain --pretrained-checkpoint DIR --load SAVE_DIR`` (restart-safe: the first launch starts
from DIR, later ones resume from SAVE_DIR) or ``--load DIR --finetune`` accepts at any TP/PP.

Steps: validate the config and every tensor's presence and shape *before* writing anything;
build a TP=PP=1 ``GPTModel`` on the CPU in the weights' dtype (uninitialised, so building costs
no compute); stream the HF tensors one Megatron weight at a time through the mapping
(:mod:`.mapping`) into its parameters; save as a ``release`` checkpoint with the saved Megatron
``args`` (:mod:`.megatron_ckpt`). Peak memory is the model once plus one layer's QKV or
gate/up tensors (safetensors are memory-mapped), i.e. about 1x the checkpoint size.

``--tensor-parallel-size`` only decides the vocabulary padding (Megatron pads to
``--make-vocab-size-divisible-by`` x TP, and a dist checkpoint's embedding shape must match the
run's); it and ``--pipeline-parallel-size`` are validated against the architecture and recorded.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from typing import Any

import torch

from megatron_endprompt.conversion.hf_config import (
    HFModelSpec,
    megatron_args,
    megatron_flags,
    read_hf_config,
)
from megatron_endprompt.conversion.hf_io import HFCheckpointReader
from megatron_endprompt.conversion.mapping import Dims, expand, mappings_for
from megatron_endprompt.conversion.megatron_ckpt import (
    build_gpt_model,
    padded_vocab_size,
    save_release_checkpoint,
    single_process_group,
)
from megatron_endprompt.conversion.output import (
    atomic_output_dir,
    check_finite,
    check_output,
    guarded_output,
)
from megatron_endprompt.errors import UserError
from megatron_endprompt.model_record import CONVERSION_RECORD

__all__ = ["HFToMegatronOptions", "convert_hf_to_megatron", "dims_for"]


@dataclass(frozen=True, kw_only=True)
class HFToMegatronOptions:
    """Options of ``convert_checkpoint.py hf-to-megatron``."""

    hf_dir: str
    """The HF model directory (``config.json`` and safetensors); only read."""
    output: str
    """The Megatron checkpoint directory to write (whole or not at all)."""
    tensor_parallel_size: int = 1
    """TP of the written checkpoint (divides the attention heads and KV groups)."""
    pipeline_parallel_size: int = 1
    """PP of the written checkpoint (divides the layers)."""
    make_vocab_size_divisible_by: int = 128
    """Megatron's vocabulary padding unit (times TP), as training will pad it."""
    overwrite: bool = False
    """Replace an existing ``output`` (otherwise it is refused)."""
    progress: bool = True
    """Show a progress bar over the tensors."""


def dims_for(spec: HFModelSpec, padded_vocab: int) -> Dims:
    """Mapping dimensions of ``spec`` with vocabulary padded to ``padded_vocab``."""
    return Dims(**spec.shape_fields(), padded_vocab_size=padded_vocab)


def _check_parallel(spec: HFModelSpec, tp: int, pp: int) -> None:
    if tp < 1 or pp < 1:
        raise UserError("--tensor-parallel-size and --pipeline-parallel-size must be >= 1")
    if spec.num_attention_heads % tp or spec.num_query_groups % tp:
        raise UserError(f"--tensor-parallel-size {tp} must divide num_attention_heads "
                        f"{spec.num_attention_heads} and num_key_value_heads "
                        f"{spec.num_query_groups}")
    if spec.num_layers % pp:
        raise UserError(f"--pipeline-parallel-size {pp} must divide num_hidden_layers "
                        f"{spec.num_layers}")


#: Tensors an HF checkpoint may carry that the model recomputes (old Llama RoPE buffers).
_DERIVED_SUFFIXES = ("rotary_emb.inv_freq",)


def _check_all_consumed(unused: set[str], hf_dir: str, dims: Dims) -> None:
    """Refuse tensors the mapping would drop: weights of layers beyond ``num_hidden_layers``
    (a conversion would silently cut the model) or of modules this architecture lacks. A tied
    model's ``lm_head.weight`` (transformers ignores it too) and RoPE buffers are skipped."""
    unused = {n for n in unused if not n.endswith(_DERIVED_SUFFIXES)
              and not (dims.tied and n == "lm_head.weight")}
    if not unused:
        return
    layers = sorted({int(m.group(1)) for n in unused
                     if (m := re.match(r"model\.layers\.(\d+)\.", n))})
    if layers and layers[0] >= dims.num_layers:
        raise UserError(
            f"{hf_dir}: config.json says num_hidden_layers={dims.num_layers} but the weights "
            f"hold {layers[-1] + 1} layers (model.layers.{layers[0]}. ... would be dropped); "
            "fix num_hidden_layers in config.json")
    listed = ", ".join(sorted(unused)[:5]) + (f" (+{len(unused) - 5} more)"
                                             if len(unused) > 5 else "")
    raise UserError(f"{hf_dir}: {len(unused)} tensor(s) this model has no place for would be "
                    f"dropped: {listed}; the checkpoint is not a plain {dims.num_layers}-layer "
                    "model of its config (remove them, or fix config.json)")


def check_hf_tensors(reader: HFCheckpointReader, dims: Dims, hf_dir: str,
                     spec: HFModelSpec) -> torch.dtype:
    """Every tensor the mapping needs is present with the shape the config implies; returns
    their (common) dtype. Raises :class:`UserError` naming the first problem."""
    dtypes = set()
    names = set(reader.names())
    consumed = set()
    for mapping, layer in expand(mappings_for(dims), dims):
        for name, want in zip(mapping.hf_names(layer=layer), mapping.hf_shapes(dims)):
            consumed.add(name)
            if name not in names:
                raise UserError(f"{hf_dir}: tensor {name} is missing (partial or non-Llama "
                                "checkpoint)")
            got = reader.shape(name)
            if got != want:
                raise UserError(
                    f"{hf_dir}: {name} has shape {list(got)} but config.json implies "
                    f"{list(want)} (num_attention_heads={dims.num_attention_heads}, "
                    f"num_key_value_heads={dims.num_query_groups}, head_dim={dims.head_dim}, "
                    f"hidden_size={dims.hidden_size}, intermediate_size={dims.ffn_hidden_size}, "
                    f"vocab_size={dims.vocab_size})")
            dtype = reader.dtype(name)
            if not dtype.is_floating_point:
                raise UserError(
                    f"{hf_dir}: tensor {name} is stored as {str(dtype).removeprefix('torch.')}, "
                    "not floating point (quantized or damaged weights: casting them to float "
                    "would silently make another model); dequantize and re-save in bf16/fp32")
            dtypes.add(dtype)
    _check_all_consumed(names - consumed, hf_dir, dims)
    if len(dtypes) != 1:
        raise UserError(f"{hf_dir}: mixed tensor dtypes {sorted(map(str, dtypes))}")
    return dtypes.pop()


def convert_hf_to_megatron(opts: HFToMegatronOptions) -> dict[str, Any]:
    """Run the conversion, ``--output`` held apart from ``--hf-dir`` and locked for the run
    (:func:`~.output.guarded_output`); returns a summary (paths, flags, sizes)."""
    with guarded_output(opts.output, inputs=[("--hf-dir", opts.hf_dir)],
                        overwrite=opts.overwrite):
        return _convert(opts)


def _convert(opts: HFToMegatronOptions) -> dict[str, Any]:
    """The conversion itself, under :func:`convert_hf_to_megatron`'s guard."""
    from tqdm import tqdm

    check_output(opts.output, overwrite=opts.overwrite)
    spec = read_hf_config(opts.hf_dir)
    tp, pp = opts.tensor_parallel_size, opts.pipeline_parallel_size
    _check_parallel(spec, tp, pp)
    padded = padded_vocab_size(spec.vocab_size, divisible_by=opts.make_vocab_size_divisible_by,
                               tensor_parallel_size=tp)
    dims = dims_for(spec, padded)
    reader = HFCheckpointReader(opts.hf_dir)
    dtype = check_hf_tensors(reader, dims, opts.hf_dir, spec)
    spec = replace(spec, dtype=str(dtype).removeprefix("torch."))
    flags = megatron_flags(spec, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                           make_vocab_size_divisible_by=opts.make_vocab_size_divisible_by)
    args = megatron_args(spec, flags, padded_vocab_size=padded)
    work = list(expand(mappings_for(dims), dims))
    with atomic_output_dir(opts.output, overwrite=opts.overwrite) as tmp, single_process_group():
        model = build_gpt_model(args)
        params = model.state_dict()
        expected = {k for k, v in params.items() if isinstance(v, torch.Tensor)}
        filled = set()
        for mapping, layer in tqdm(work, desc="hf-to-megatron", unit="tensor",
                                   disable=not opts.progress):
            name = mapping.megatron_name(layer=layer)
            hf = [reader.get(n) for n in mapping.hf_names(layer=layer)]
            for n, t in zip(mapping.hf_names(layer=layer), hf):
                check_finite(t, f"{opts.hf_dir}: tensor {n}")
            with torch.no_grad():
                params[name].copy_(mapping.to_megatron(hf, dims))
            filled.add(name)
            del hf
        if filled != expected:  # the mapping must cover the model exactly
            raise RuntimeError(f"mapping does not cover the Megatron model: missing "
                               f"{sorted(expected - filled)}, extra {sorted(filled - expected)}")
        ckpt_dir = save_release_checkpoint(model, args, tmp)
        record = {"source": os.path.abspath(opts.hf_dir), "megatron_flags": flags,
                  "vocab_size": spec.vocab_size, "padded_vocab_size": padded,
                  "tensor_parallel_size": tp, "pipeline_parallel_size": pp,
                  "dtype": spec.dtype}
        with open(os.path.join(tmp, CONVERSION_RECORD), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
        del model, params
    return {**record, "output": opts.output,
            "checkpoint": os.path.join(opts.output, os.path.basename(ckpt_dir)),
            "tensors": len(work)}
