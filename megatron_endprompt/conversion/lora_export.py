"""LoRA adapters of a Megatron checkpoint on their way to HF: merged, or as a PEFT directory.

A LoRA run's ``torch_dist`` checkpoint holds, beside each wrapped linear's frozen ``W``
(``<linear>.weight``), its adapters ``<linear>.lora_a`` ``[layers, r, in]`` and
``<linear>.lora_b`` ``[layers, out, r]`` (global, layer-stacked, Megatron's fused layouts:
``linear_qkv``'s rows per query group, ``linear_fc1``'s ``cat(gate, up)``).

* ``merged`` (the default): every HF weight is ``W + (alpha / r) B A``, computed in float32 in
  Megatron's layout and then split like ``W`` (:mod:`.transforms`); a plain HF model results.
* ``peft``: the base tensors are not written; ``adapter_model.safetensors`` holds, per HF
  projection, ``lora_A = A`` and ``lora_B`` = the rows of ``B`` that projection owns (``B``
  split by the same transform as ``W``: ``q/k/v_proj`` share ``linear_qkv``'s ``A``,
  ``gate/up_proj`` share ``linear_fc1``'s), and ``adapter_config.json`` PEFT's ``LoraConfig``
  (``r``, ``lora_alpha``, the HF target modules). HF ``peft`` loads the directory onto the
  original HF model; the directory's ``config.json`` is that model's config with the EndPrompt
  RoPE scaling (load the base with it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from megatron_endprompt.conversion.megatron_ckpt import read_tensor
from megatron_endprompt.errors import UserError

__all__ = ["LORA_FORMATS", "LoraExport", "merge_weight"]

#: ``--lora-format`` choices.
LORA_FORMATS = ("merged", "peft")

PEFT_WEIGHTS = "adapter_model.safetensors"
PEFT_CONFIG = "adapter_config.json"


def merge_weight(weight: Tensor, lora_a: Tensor, lora_b: Tensor, scaling: float) -> Tensor:
    """``W + scaling * B A`` in float32, returned in ``W``'s dtype: ``W [..., out, in]``,
    ``A [..., r, in]``, ``B [..., out, r]`` (leading layer dimensions broadcast)."""
    merged = weight.float() + scaling * torch.matmul(lora_b.float(), lora_a.float())
    return merged.to(weight.dtype)


def _adapter_keys(weight_key: str) -> tuple[str, str]:
    stem = weight_key.removesuffix(".weight")
    return f"{stem}.lora_a", f"{stem}.lora_b"


@dataclass(kw_only=True)
class LoraExport:
    """The adapters of one checkpoint being exported (:meth:`from_checkpoint`)."""

    checkpoint: str
    """The ``iter_*`` directory read."""

    meta: dict[str, tuple[tuple[int, ...], torch.dtype]]
    """The checkpoint's tensor metadata (:func:`~.megatron_ckpt.tensor_metadata`)."""

    rank: int
    """``r``."""

    alpha: float
    """``alpha``: the adapters add ``(alpha / r) B A``."""

    format: str = "merged"
    """One of :data:`LORA_FORMATS`."""

    peft_tensors: dict[str, Tensor] = field(default_factory=dict)
    """PEFT's tensors collected so far (``format == "peft"``)."""

    modules: set[str] = field(default_factory=set)
    """HF module names with adapters (PEFT's ``target_modules``)."""

    @classmethod
    def from_checkpoint(cls, checkpoint: str, meta: dict, *, rank: int | None,
                        alpha: float | None, lora_format: str) -> LoraExport | None:
        """The checkpoint's adapters (``rank``/``alpha``: the training run's saved
        ``--endprompt-lora-*``, ``None`` if it saved none), or ``None`` without adapters for
        ``merged``. Raises :class:`UserError` for ``peft`` without adapters."""
        a_keys = sorted(k for k in meta if k.endswith(".lora_a"))
        if not a_keys:
            if lora_format == "peft":
                raise UserError(f"--lora-format peft: {checkpoint} holds no LoRA adapters (a "
                                "run without --endprompt-lora-rank); export it without "
                                "--lora-format")
            return None
        r = int(meta[a_keys[0]][0][-2])
        if rank is not None and int(rank) != r:
            raise UserError(f"{checkpoint}: adapters of rank {r}, the saved args say "
                            f"--endprompt-lora-rank {rank}; the checkpoint is inconsistent")
        return cls(checkpoint=checkpoint, meta=meta, rank=r,
                   alpha=float(alpha if alpha is not None else r), format=lora_format)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    @property
    def peft(self) -> bool:
        return self.format == "peft"

    def has_adapters(self, key: str) -> bool:
        return _adapter_keys(key)[0] in self.meta

    def _read(self, key: str) -> tuple[Tensor, Tensor]:
        a_key, b_key = _adapter_keys(key)
        return (read_tensor(self.checkpoint, a_key, self.meta[a_key]),
                read_tensor(self.checkpoint, b_key, self.meta[b_key]))

    def merged(self, key: str, tensor: Tensor) -> Tensor:
        """``tensor`` (the weight at checkpoint ``key``) with its adapters merged in, or as
        is when it has none."""
        if not self.has_adapters(key):
            return tensor
        a, b = self._read(key)
        return merge_weight(tensor, a, b, self.scaling)

    def collect_peft(self, key: str, stacked: bool, parts: list[tuple[Any, int | None]],
                     dims: Any) -> None:
        """PEFT's ``lora_A`` / ``lora_B`` of every HF projection the weight at ``key`` maps to
        (``parts``: ``[(mapping, layer)]`` as the export reads it)."""
        if not self.has_adapters(key):
            return
        a, b = self._read(key)
        for mapping, layer in parts:
            a_l, b_l = (a[layer], b[layer]) if stacked else (a, b)
            for name, b_part in zip(mapping.hf_names(layer=layer), mapping.to_hf(b_l, dims)):
                stem = name.removesuffix(".weight")
                self.modules.add(stem.rsplit(".", 1)[-1])
                self.peft_tensors[f"base_model.model.{stem}.lora_A.weight"] = \
                    a_l.contiguous().clone()
                self.peft_tensors[f"base_model.model.{stem}.lora_B.weight"] = \
                    b_part.contiguous().clone()

    def write_peft(self, out_dir: str, *, dropout: float | None = None,
                   base_model: str | None = None) -> list[str]:
        """``adapter_model.safetensors`` and ``adapter_config.json`` into ``out_dir``;
        returns the weight file's name."""
        from safetensors.torch import save_file

        save_file(self.peft_tensors, os.path.join(out_dir, PEFT_WEIGHTS),
                  metadata={"format": "pt"})
        config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.rank,
                  "lora_alpha": self.alpha, "lora_dropout": float(dropout or 0.0),
                  "target_modules": sorted(self.modules), "bias": "none",
                  "fan_in_fan_out": False, "inference_mode": True, "use_rslora": False,
                  "use_dora": False, "base_model_name_or_path": base_model}
        with open(os.path.join(out_dir, PEFT_CONFIG), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
        return [PEFT_WEIGHTS]
