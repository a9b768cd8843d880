"""YaRN and NTK-by-parts RoPE frequencies for EndPrompt's jumped positions.

Why a separate scaling: linear PI divides every position by ``s``; YaRN (Peng et al. 2023,
arXiv:2309.00071, sec. 3.2-3.4) instead interpolates only the low-frequency dimensions. With
``r_j = L0 * inv_freq_j / (2 pi)`` rotations of dimension pair ``j`` over the original window
``L0``, pairs that rotate more than ``beta_fast`` times keep their frequency, pairs that rotate
fewer than ``beta_slow`` times are divided by ``factor``, and a linear ramp blends the two in
between ("NTK-by-parts"). YaRN adds an attention temperature: cos and sin are both multiplied by
``attention_factor = 0.1 ln(factor) + 1`` (so q.k grows by its square). NTK-by-parts is the same
frequencies with ``attention_factor = 1``.

With EndPrompt the angles are ``position_ids[b, s] * inv_freq[j]`` for the batch's own (jumped)
positions, no division by ``s``: YaRN's ``factor`` plays the role of ``s`` and its
``original_max_position_embeddings`` is ``L0``.

The operation order follows Hugging Face's ``rope_type="yarn"`` (``modeling_rope_utils``) and
Megatron's ``YarnRotaryEmbedding`` (they agree), so the frequencies are bit-identical to HF's and
the attention factor is the float both compute. Megatron applies the factor inside
``apply_rotary_pos_emb`` (``cos(freqs) * mscale``, ``sin(freqs) * mscale``, the same as HF's
``cos * attention_scaling``) when the ``TransformerConfig`` carries ``yarn_rotary_scaling_factor``
/ ``yarn_mscale`` / ``yarn_mscale_all_dim``: :meth:`YarnScaling.megatron_config_fields` gives the
values that make Megatron's factor equal :meth:`YarnScaling.attention_factor`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["ROPE_SCALINGS", "YarnScaling", "yarn_from_megatron_args", "yarn_scaling"]

#: ``--endprompt-rope-scaling`` choices: linear position interpolation by ``s`` (the default),
#: YaRN, NTK-by-parts (YaRN's frequencies without its attention factor).
ROPE_SCALINGS = ("linear", "yarn", "ntk-by-parts")


@dataclass(frozen=True, kw_only=True)
class YarnScaling:
    """YaRN / NTK-by-parts parameters (HF ``rope_parameters`` of ``rope_type: yarn``)."""

    factor: float
    """Context extension factor (EndPrompt's ``s``, about ``L / L0``), >= 1."""
    original_max_position_embeddings: int
    """``L0``: the window the base model was trained on (sets which dimensions interpolate)."""
    beta_fast: float = 32.0
    """Dimension pairs rotating more than this many times over ``L0`` are kept as they are."""
    beta_slow: float = 1.0
    """Dimension pairs rotating fewer than this many times over ``L0`` are divided by ``factor``."""
    truncate: bool = True
    """Round the ramp's bounds to whole dimensions (HF ``truncate``, Megatron
    ``correction_range_round_to_int``)."""
    attention_scaling: bool = True
    """YaRN's attention factor ``0.1 ln(factor) + 1`` on cos/sin; ``False``: NTK-by-parts
    (factor 1)."""

    def __post_init__(self) -> None:
        if not float(self.factor) >= 1.0:
            raise ValueError(f"YaRN factor must be >= 1, got {self.factor}")
        if int(self.original_max_position_embeddings) <= 0:
            raise ValueError("YaRN original_max_position_embeddings must be positive, got "
                             f"{self.original_max_position_embeddings}")
        if not self.beta_fast > self.beta_slow > 0:
            raise ValueError(f"YaRN needs beta_fast > beta_slow > 0, got {self.beta_fast} and "
                             f"{self.beta_slow}")

    @property
    def kind(self) -> str:
        """``"yarn"`` or ``"ntk-by-parts"`` (the ``--endprompt-rope-scaling`` value)."""
        return "yarn" if self.attention_scaling else "ntk-by-parts"

    def attention_factor(self) -> float:
        """The factor on cos and sin: ``0.1 ln(factor) + 1`` for YaRN (1 when ``factor <= 1``),
        1 for NTK-by-parts."""
        if not self.attention_scaling or self.factor <= 1:
            return 1.0
        return 0.1 * math.log(self.factor) + 1.0

    def _correction_dim(self, rotations: float, dim: int, base: float) -> float:
        """The (fractional) dimension index whose pair rotates ``rotations`` times over ``L0``."""
        L0 = self.original_max_position_embeddings
        return (dim * math.log(L0 / (rotations * 2 * math.pi))) / (2 * math.log(base))

    def ramp_bounds(self, dim: int, base: float) -> tuple[float, float]:
        """``(low, high)``: pair indices where the ramp from kept to interpolated starts/ends."""
        low = self._correction_dim(self.beta_fast, dim, base)
        high = self._correction_dim(self.beta_slow, dim, base)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        return max(low, 0), min(high, dim - 1)

    def inv_freq(self, dim: int, base: float, device: torch.device | str | None = None
                 ) -> Tensor:
        """fp32 ``[dim/2]`` inverse frequencies for rotary dim ``dim`` and RoPE base ``base``."""
        exponent = torch.arange(0, dim, 2).to(device=device, dtype=torch.float) / dim
        pos_freqs = float(base) ** exponent
        kept = 1.0 / pos_freqs
        interpolated = 1.0 / (self.factor * pos_freqs)
        low, high = self.ramp_bounds(dim, float(base))
        if low == high:
            high += 0.001  # a one-dimension ramp would divide by zero
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp.to(device=device, dtype=torch.float)
        return interpolated * (1 - keep) + kept * keep

    def megatron_config_fields(self) -> dict[str, Any]:
        """``TransformerConfig`` attributes under which Megatron's attention multiplies cos/sin
        by :meth:`attention_factor`: ``mscale = mscale_all_dim = None`` gives
        ``0.1 ln(factor) + 1``; equal ones give exactly 1 (NTK-by-parts)."""
        same = None if self.attention_scaling else 1.0
        return {"yarn_rotary_scaling_factor": float(self.factor), "yarn_mscale": same,
                "yarn_mscale_all_dim": same}


def yarn_scaling(kind: str, *, factor: float | None, original_length: int,
                 megatron_args: Any) -> YarnScaling | None:
    """YaRN scaling of ``kind`` (``linear`` -> ``None``) with ``factor`` ``s`` over ``L0`` =
    ``original_length``, and the ramp from Megatron's own ``--yarn-beta-fast/--yarn-beta-slow/
    --[no-]yarn-correction-range-round-to-int`` in ``megatron_args``."""
    if kind == "linear":
        return None
    if kind not in ROPE_SCALINGS:
        raise ValueError(f"--endprompt-rope-scaling {kind!r}: choose one of "
                         f"{', '.join(ROPE_SCALINGS)}")
    truncate = getattr(megatron_args, "yarn_correction_range_round_to_int", None)
    return YarnScaling(
        factor=float(factor or 1.0),
        original_max_position_embeddings=int(original_length),
        beta_fast=float(getattr(megatron_args, "yarn_beta_fast", None) or 32.0),
        beta_slow=float(getattr(megatron_args, "yarn_beta_slow", None) or 1.0),
        truncate=True if truncate is None else bool(truncate),
        attention_scaling=kind == "yarn")


def yarn_from_megatron_args(args: Any) -> YarnScaling | None:
    """The YaRN scaling a checkpoint's saved Megatron ``args`` record
    (``--endprompt-rope-scaling yarn|ntk-by-parts``, factor ``args.endprompt_pi_factor``,
    ``L0 = args.endprompt_original_length``), or ``None`` for linear PI (also for checkpoints
    saved before the flag existed). The export reads it; training takes its scaling from the
    run (:class:`~megatron_endprompt.training.run.EndPromptRun`)."""
    kind = getattr(args, "endprompt_rope_scaling", None) or "linear"
    if kind == "linear":
        return None
    return yarn_scaling(kind, factor=getattr(args, "endprompt_pi_factor", None),
                        original_length=args.endprompt_original_length, megatron_args=args)
