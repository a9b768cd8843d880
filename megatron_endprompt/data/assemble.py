"""One EndPrompt sample as training sees it: stored tokens plus its layout record in, the
``tokens``/``labels``/``loss_mask``/``position_ids``/``terminal_mask`` arrays out.

The dataset (:class:`~megatron_endprompt.data.dataset.EndPromptGPTDataset`) and
``endprompt-inspect`` both call :func:`assemble_sample`, so what inspect shows is what the
trainer gets (EOD and padding masking included), not a second reconstruction that can drift.
numpy only: inspect stays free of torch and Megatron-Core.

Megatron conventions kept (``GPTDataset``'s): the last input's label is the stored extra token
(``add_extra_token_to_sequence``; without it the last label is padding with weight 0); with
``eod_mask_loss`` the weight of every position whose *input* token is EOD is 0 (a prediction
across a document boundary) — except the terminal predictions (``i >= a - 1``) of a *prompt*
terminal, whose tokens are the prompt itself: EP2's single end token makes the only prediction
from the terminal, and masking it would train nothing there; padding labels get weight 0 and
padding ids become 0. A prompt terminal's last prediction (``i = P - 1``, of the label after
the prompt) has weight 0: the paper's objective stops at the last prompt token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from megatron_endprompt.layout import (context_length, loss_weights_from_record,
                                       positions_from_record)
from megatron_endprompt.loss_weights import LossWeights

__all__ = ["SampleRules", "assemble_sample", "layout_arrays", "pad_in_data"]


@dataclass(frozen=True, kw_only=True)
class SampleRules:
    """What turns a stored sample into training arrays, fixed per (prefix, run)."""

    seq_length: int
    """``P``: inputs per sample (the stored sample holds ``P + 1`` tokens)."""
    weights: LossWeights
    """Terminal ``w`` (predictions ``i >= a - 1``) and context weight (``i < a - 1``), both
    set: the sidecar's with the run's overrides applied."""
    prompt_terminal: bool
    """The terminal is a prompt (``terminal_source == "prompt"``): its predictions escape EOD
    masking and nothing is predicted after its last token."""
    eod: int | None = None
    """EOD id whose inputs get weight 0 (``eod_mask_loss``); ``None``: no EOD masking."""
    pad: int | None = None
    """Padding id when it can occur among stored tokens (:func:`pad_in_data`), else ``None``."""
    extra_token: bool = True
    """``add_extra_token_to_sequence``: the last label is the stored ``P + 1``-th token."""


def pad_in_data(pad: object, dtype: np.dtype) -> int | None:
    """``pad`` when it is an integer a ``dtype`` corpus can hold, else ``None`` (Megatron's
    ``-1`` default, or a tokenizer without a pad token, e.g. Llama-3)."""
    info = np.iinfo(dtype)
    if isinstance(pad, (int, np.integer)) and info.min <= pad <= info.max:
        return int(pad)
    return None


def layout_arrays(record: np.ndarray, rules: SampleRules) -> tuple[np.ndarray, np.ndarray]:
    """``position_ids`` int64 ``[P]`` and base loss weights float32 ``[P]`` of one record
    (before EOD/padding masking)."""
    P = rules.seq_length
    return positions_from_record(record, P), loss_weights_from_record(
        record, P, rules.weights, predict_after_terminal=not rules.prompt_terminal)


def assemble_sample(text: np.ndarray, record: np.ndarray, rules: SampleRules, *,
                    layout: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """``{"tokens", "labels"}`` int64 ``[P]``, ``{"loss_mask", "terminal_mask"}`` float32
    ``[P]`` and ``"position_ids"`` int64 ``[P]`` from ``text`` (the stored sample, ``P + 1``
    tokens, or ``P`` without the extra token) and its layout ``record``. ``layout``: this
    record's :func:`layout_arrays`, already computed (a cache); they are modified in place, so
    pass copies. Masking is done in numpy: torch boolean-mask assignments cost ~15 us each at
    P=8192, numpy's a few us."""
    P = rules.seq_length
    tokens = text[:P].astype(np.int64)
    if rules.extra_token:
        labels = text[1 : P + 1].astype(np.int64)
    else:  # torch.roll(tokens, -1) with the last label set to padding
        labels = np.empty(P, dtype=np.int64)
        labels[:-1] = tokens[1:]
        labels[-1] = 0 if rules.pad is None else rules.pad  # Llama-3 has no pad token
    position_ids, loss_mask = layout if layout is not None else layout_arrays(record, rules)
    a = context_length(record)
    terminal_mask = np.zeros(P, dtype=np.float32)
    terminal_mask[a - 1 :] = 1.0
    if rules.eod is not None:
        is_eod = tokens == rules.eod
        if rules.prompt_terminal:  # every terminal prediction keeps its weight
            is_eod[a - 1 :] = False
        loss_mask[is_eod] = 0.0
    if rules.pad is not None:
        is_pad = labels == rules.pad
        loss_mask[is_pad] = 0.0
        labels[is_pad] = 0
        tokens[tokens == rules.pad] = 0
    elif not rules.extra_token:  # the pad id is not a stored token: only the padded last label
        loss_mask[-1] = 0.0
        labels[-1] = 0
    return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask,
            "position_ids": position_ids, "terminal_mask": terminal_mask}
