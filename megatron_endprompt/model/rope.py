"""Rotary position embedding driven by the batch's ``position_ids``, with position interpolation.

Stock Megatron-Core ``RotaryEmbedding`` builds its angles from ``arange(seq_len)``: it cannot see
that an EndPrompt sample's positions jump (context ``0..a-1``, terminal ``L-b..L-1``).
:class:`EndPromptRotaryEmbedding` subclasses it and adds one entry point,
``forward(position_ids)``, that builds the angles from the positions themselves::

    theta[s, b, j] = position_ids[b, s] * inv_freq[j] / pi_factor

``inv_freq`` is Megatron's own (optionally already Llama-3.1-scaled by ``rope_scaling``), so this is
exactly Hugging Face's Llama RoPE with ``rope_type="linear", factor=pi_factor`` (same operation
order: the frequencies are divided by the factor, then multiplied by the positions). With
``yarn`` (:class:`~megatron_endprompt.model.yarn.YarnScaling`) ``inv_freq`` is YaRN's /
NTK-by-parts' instead, ``s`` is 1 (YaRN's factor replaces it), and :attr:`attention_factor` is the
factor Megatron's attention applies to cos/sin (see :mod:`~megatron_endprompt.model.yarn`).

Shapes (``D`` = rotary dim, ``kv_channels * rotary_percent``):

* all rows of the micro-batch share one layout -> ``[S, 1, 1, D]``, the shape Transformer Engine's
  fused RoPE accepts;
* rows differ -> ``[S, B, 1, D]``; Megatron's unfused ``apply_rotary_pos_emb`` broadcasts it
  against q/k ``[S, B, H, D]`` (the fused path is redirected there, see
  :mod:`megatron_endprompt.runtime.rope`, installed by ``runtime.install()``).

Per call: Megatron's language models (``GPTModel``, ``HybridModel``) call their RoPE module with
a sequence length only (``self.rotary_pos_emb(rotary_seq_len, packed_seq=...)``, inside
``forward``). :meth:`EndPromptRotaryEmbedding.call_positions` hands the module the batch's
``position_ids`` for the duration of one model forward; a length-only call inside it returns
the freqs of those positions (after checking that they cover the length asked for). A
length-only call *outside* any such block raises: a caller that bypasses the model's forward
would otherwise get contiguous positions without a word. Inference enters the block with
``contiguous=True`` and gets stock behaviour (contiguous positions, divided by ``s``).

Context parallelism: the ``position_ids`` given are this CP rank's zig-zag slice (the data path
slices them exactly like the tokens), so the result is used as is. Stock ``forward`` slices the
full-length table by CP rank; this path never does, so nothing is sliced twice.

Checkpoints: the module adds no parameter or buffer (stock ``inv_freq`` is a plain attribute and
is dropped on load), so model ``state_dict`` keys are stock GPTModel's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from torch import Tensor

from megatron_endprompt.model.yarn import YarnScaling
from megatron_endprompt.window import resolve_pi_factor

__all__ = ["EndPromptRotaryEmbedding", "freqs_to_emb", "resolve_pi_factor"]

#: :meth:`EndPromptRotaryEmbedding.call_positions` state for inference: stock positions.
_CONTIGUOUS = "contiguous"


def freqs_to_emb(freqs: Tensor, *, interleaved: bool) -> Tensor:
    """Half-dim angles ``[..., D/2]`` -> Megatron's RoPE layout ``[..., D]``.

    Non-interleaved: ``[f_0..f_{D/2-1}, f_0..f_{D/2-1}]`` (rotate-half); interleaved:
    ``[f_0, f_0, f_1, f_1, ...]`` — the layouts stock ``RotaryEmbedding.get_emb`` builds.
    """
    if interleaved:
        return torch.stack((freqs, freqs), dim=-1).flatten(-2)
    return torch.cat((freqs, freqs), dim=-1)


class EndPromptRotaryEmbedding(RotaryEmbedding):
    """Megatron ``RotaryEmbedding`` that also builds freqs from ``position_ids [B, S]``.

    Called with a tensor, returns freqs ``[S, 1, 1, D]`` (shared layout) or ``[S, B, 1, D]``;
    called as stock (``forward(max_seq_len, offset=0, packed_seq=False, cp_group=None)``, e.g. by
    Megatron's inference path) it behaves as stock with contiguous positions, divided by the same
    ``s``. The PI factor is stored in stock's ``seq_len_interpolation_factor`` attribute (``None``
    for ``s == 1``), so exporters reading that attribute see it.

    Args (keyword-only): as stock ``RotaryEmbedding``, with ``pi_factor`` in place of
    ``seq_len_interpolation_factor`` (either may be given, see
    :func:`megatron_endprompt.window.resolve_pi_factor`, the one place ``s`` is resolved), and
    ``yarn`` (YaRN / NTK-by-parts frequencies; excludes ``s != 1``, ``rope_scaling`` and
    interleaving).
    """

    def __init__(
        self,
        *,
        kv_channels: int,
        rotary_percent: float = 1.0,
        rotary_interleaved: bool = False,
        pi_factor: float | None = None,
        seq_len_interpolation_factor: float | None = None,
        rotary_base: int = 10000,
        rope_scaling: bool = False,
        rope_scaling_factor: float = 8.0,
        use_cpu_initialization: bool = False,
        cp_group: torch.distributed.ProcessGroup | None = None,
        yarn: YarnScaling | None = None,
    ) -> None:
        s = resolve_pi_factor(pi_factor, seq_len_interpolation_factor)
        super().__init__(
            kv_channels=kv_channels,
            rotary_percent=rotary_percent,
            rotary_interleaved=rotary_interleaved,
            seq_len_interpolation_factor=None if s == 1.0 else s,
            rotary_base=rotary_base,
            rope_scaling=rope_scaling,
            rope_scaling_factor=rope_scaling_factor,
            use_cpu_initialization=use_cpu_initialization,
            cp_group=cp_group,
        )
        self.yarn = None
        self._call: Tensor | str | None = None
        if yarn is not None:
            self._use_yarn(yarn, rotary_base=rotary_base, llama3=rope_scaling)

    def _use_yarn(self, yarn: YarnScaling, *, rotary_base: float, llama3: bool) -> None:
        """Replace ``inv_freq`` by YaRN's (same rotary dim, device); refuses what YaRN excludes."""
        if self.pi_factor != 1.0:
            raise ValueError(f"YaRN RoPE replaces position interpolation: its factor "
                             f"{yarn.factor:g} is the extension, so pi_factor must be 1 (got "
                             f"{self.pi_factor:g})")
        if llama3:
            raise ValueError("YaRN RoPE cannot be combined with Llama-3.1 rope_scaling")
        if self.rotary_interleaved:
            raise ValueError("YaRN RoPE is defined for rotate-half (non-interleaved) RoPE")
        dim = 2 * self.inv_freq.numel()
        self.inv_freq = yarn.inv_freq(dim, rotary_base, device=self.inv_freq.device)
        self.yarn = yarn

    @property
    def attention_factor(self) -> float:
        """The factor on cos and sin (YaRN's temperature; 1 without YaRN)."""
        return 1.0 if self.yarn is None else self.yarn.attention_factor()

    @property
    def pi_factor(self) -> float:
        """``s``: positions are divided by it (1 = no interpolation)."""
        return float(self.seq_len_interpolation_factor or 1.0)

    def _scaled_inv_freq(self, device: torch.device) -> Tensor:
        """``inv_freq / s`` ``[D/2]`` fp32 on ``device`` (``inv_freq`` is moved there once)."""
        if self.inv_freq.device != device:
            self.inv_freq = self.inv_freq.to(device)
        s = self.pi_factor
        return self.inv_freq if s == 1.0 else self.inv_freq / s

    def get_freqs_non_repeated(self, max_seq_len: int, offset: int = 0) -> Tensor:
        """Stock contiguous-position angles ``[max_seq_len, D/2]``, computed in the same order
        as :meth:`freqs_from_position_ids` so both paths agree bit for bit."""
        seq = torch.arange(max_seq_len, device=self.inv_freq.device, dtype=torch.float32) + offset
        return torch.outer(seq, self._scaled_inv_freq(self.inv_freq.device))

    @staticmethod
    def shares_layout(position_ids: Tensor) -> bool:
        """True when every row of ``position_ids [B, S]`` equals the first (one host sync
        when ``B > 1``)."""
        if position_ids.shape[0] == 1:
            return True
        return bool((position_ids == position_ids[:1]).all())

    def freqs_from_position_ids(self, position_ids: Tensor) -> Tensor:
        """RoPE angles for ``position_ids`` ``[B, S]`` (or ``[S]``), integer or float.

        Returns fp32 ``[S, 1, 1, D]`` when all rows share one layout, else ``[S, B, 1, D]``.
        Never slices for context parallelism: ``position_ids`` are already this rank's.
        """
        if position_ids.dim() == 1:
            position_ids = position_ids[None]
        if position_ids.dim() != 2:
            raise ValueError(f"position_ids must be [B, S], got shape {tuple(position_ids.shape)}")
        rows = position_ids[:1] if self.shares_layout(position_ids) else position_ids
        inv_freq = self._scaled_inv_freq(rows.device)
        freqs = rows.to(torch.float32)[..., None] * inv_freq  # [B', S, D/2]
        emb = freqs_to_emb(freqs.transpose(0, 1), interleaved=self.rotary_interleaved)
        return emb[:, :, None, :]  # [S, B', 1, D]

    @contextmanager
    def call_positions(self, position_ids: Tensor | None, *,
                       contiguous: bool = False) -> Iterator[None]:
        """Within the block, a length-only call (how Megatron's models call their RoPE module)
        returns freqs for ``position_ids [B, S]`` (this CP rank's slice); ``contiguous=True``
        (inference): stock contiguous positions instead. Restored on exit, nesting included.

        Raises ``ValueError`` for ``position_ids=None`` without ``contiguous`` (e.g. a pipeline
        stage that was given none)."""
        if position_ids is None and not contiguous:
            raise ValueError(
                "EndPrompt RoPE needs position_ids on every pipeline stage (stock get_batch "
                "gives middle/last stages none); pass the sample's EndPrompt positions")
        saved, self._call = self._call, (_CONTIGUOUS if contiguous else position_ids)
        try:
            yield
        finally:
            self._call = saved

    def _given_positions(self, max_seq_len: int, offset: int = 0, packed_seq: bool = False,
                         cp_group: Any = None) -> Tensor:
        """The positions handed in by :meth:`call_positions`, checked against the length the
        model asked for (``rotary_seq_len``: this rank's tokens times CP, times TP under
        sequence parallelism)."""
        positions = self._call
        if positions is None:
            raise RuntimeError(
                "EndPrompt RoPE was asked for freqs without the batch's position_ids (a caller "
                "outside the model's forward, e.g. the combined-1F1B schedule plan of "
                "--overlap-moe-expert-parallel-comm or per-layer CUDA graphs); it would apply "
                "contiguous positions, so it is refused: run without that feature")
        if packed_seq:
            raise NotImplementedError("EndPrompt RoPE does not support packed (thd) sequences")
        if offset:
            raise ValueError(f"EndPrompt RoPE takes positions, not an offset (got {offset})")
        group = cp_group if cp_group is not None else self.cp_group
        cp = group.size() if group is not None else 1
        if positions.dim() != 2 or positions.shape[1] * cp != max_seq_len:
            raise ValueError(
                f"position_ids {tuple(positions.shape)} do not match this rank's sequence "
                f"length {max_seq_len // cp} (context parallel: pass positions sliced once, "
                "like the tokens)")
        return positions

    def forward(self, position_ids: Tensor | int, *args: Any, **kwargs: Any) -> Tensor:
        """``forward(position_ids [B, S])`` -> freqs ``[S, 1|B, 1, D]``. An ``int`` first
        argument is stock's ``max_seq_len`` (``offset=0, packed_seq=False, cp_group=None``):
        inside :meth:`call_positions` it returns the handed positions' freqs (or stock's, for
        ``contiguous=True``); outside it raises."""
        if isinstance(position_ids, Tensor):
            if args or kwargs:
                raise TypeError("forward(position_ids) takes no further arguments")
            return self.freqs_from_position_ids(position_ids)
        if self._call is _CONTIGUOUS:
            return super().forward(position_ids, *args, **kwargs)
        return self.freqs_from_position_ids(self._given_positions(position_ids, *args, **kwargs))
