"""Per-row RoPE freqs under Transformer Engine's fused RoPE (GPU runs with ``--apply-rope-fusion``,
Megatron's default with TE).

EndPrompt micro-batches whose rows have different layouts carry freqs ``[S, B, 1, D]``; TE's
fused kernel takes only ``[S, 1, 1, D]``. Megatron 0.18-0.20's ``rope_utils.apply_rotary_pos_emb``
calls the module global ``fused_apply_rotary_pos_emb`` when ``config.apply_rope_fusion``; this
patch puts a router there: ``[S, B>1, 1, D]`` goes to Megatron's unfused
``_apply_rotary_pos_emb_bshd``, everything else (shared layouts) still to TE.
"""

from __future__ import annotations

from typing import Any

from megatron_endprompt.runtime.ledger import Ledger

_PATCH = "rope-fallback"

#: Fingerprints, per reviewed release (0.20.0 = Megatron-LM main d98e8a64), of the code the
#: router relies on: the caller that reads the global (keyword ``interleaved``), and the
#: unfused kernel it routes to (``rotary_interleaved`` keyword in all three).
FINGERPRINTS: dict[str, dict[str, str]] = {
    "apply_rotary_pos_emb": {
        "0.18.2": "6b55f0234785",
        "0.19.2": "f582e45a6585",
        "0.20.0": "443873905f74",
    },
    "_apply_rotary_pos_emb_bshd": {
        "0.18.2": "3a8beadeb7a2",
        "0.19.2": "63027296b981",
        "0.20.0": "c3dee9727de8",
    },
}


def is_batched_freqs(freqs: Any) -> bool:
    """Whether ``freqs`` is per-row ``[S, B, 1, D]`` with ``B > 1`` (TE's fused RoPE refuses it)."""
    return freqs.dim() == 4 and freqs.shape[1] > 1


def install_rope_fallback(ledger: Ledger) -> bool:
    """Route per-row freqs around TE's fused RoPE; returns False when TE's kernel is absent
    (nothing to route: Megatron then refuses ``apply_rope_fusion`` itself)."""
    from megatron.core.models.common.embeddings import rope_utils

    fused = rope_utils.fused_apply_rotary_pos_emb
    if fused is None:
        return False
    for name, expected in FINGERPRINTS.items():
        ledger.check(rope_utils, name, expected, patch=_PATCH)
    unfused = rope_utils._apply_rotary_pos_emb_bshd

    def fused_or_unfused(t: Any, freqs: Any, *args: Any, **kwargs: Any) -> Any:
        """TE's fused RoPE for ``[S, 1, 1, D]``; Megatron's unfused kernel for ``[S, B, 1, D]``."""
        if is_batched_freqs(freqs):
            return unfused(t, freqs, rotary_interleaved=kwargs.get("interleaved", False))
        return fused(t, freqs, *args, **kwargs)

    ledger.replace(rope_utils, "fused_apply_rotary_pos_emb", fused_or_unfused, patch=_PATCH)
    return True
