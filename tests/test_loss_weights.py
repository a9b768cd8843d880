"""``LossWeights``: validated once on construction (errors name the tool's flag), the source's
default ``w``, training overrides over a sidecar's weights, and the sidecar header's flat
``layout`` form unchanged by the layout holding one value."""

from __future__ import annotations

import dataclasses
import math

import pytest

from megatron_endprompt.layout import LAYOUT_HEADER_KEYS, LayoutConfig
from megatron_endprompt.loss_weights import LossWeights
from megatron_endprompt.window import PREPROCESS_FLAGS, EndPromptWindow


@pytest.mark.parametrize("kwargs, flags, message", [
    (dict(terminal=0.0), None, "w=0.0 must be finite and > 0 \\(--endprompt-terminal-loss-weight"),
    (dict(terminal=-1.0), PREPROCESS_FLAGS, "must be finite and > 0 \\(--terminal-loss-weight"),
    (dict(terminal=math.inf), None, "must be finite and > 0"),
    (dict(context=-0.5), PREPROCESS_FLAGS, "must be finite and >= 0 \\(--context-loss-weight\\)"),
    (dict(context=math.nan), None, "\\(--endprompt-context-loss-weight\\)"),
])
def test_validation_names_the_flag(kwargs, flags, message):
    with pytest.raises(ValueError, match=message):
        LossWeights(**kwargs, **({"flags": flags} if flags else {}))


def test_frozen_keyword_only_and_unset_fields():
    weights = LossWeights(terminal=1, context=0)
    assert (weights.terminal, weights.context) == (1.0, 0.0)
    assert isinstance(weights.terminal, float) and weights.complete
    assert not LossWeights(terminal=0.5).complete
    with pytest.raises(dataclasses.FrozenInstanceError):
        weights.terminal = 2.0
    with pytest.raises(TypeError):
        LossWeights(0.5, 1.0)  # keyword-only


def test_source_defaults():
    """w = 0.1 for prompt terminals when not given (the paper's small non-zero w), else 1.0;
    a given w wins."""
    assert LossWeights.for_source("prompt") == LossWeights(terminal=0.1, context=1.0)
    assert LossWeights.for_source("continuation").terminal == 1.0
    assert LossWeights.for_source("document-tail", terminal=0.3, context=0.0) == \
        LossWeights(terminal=0.3, context=0.0)
    with pytest.raises(ValueError, match="--terminal-loss-weight"):
        LossWeights.for_source("prompt", terminal=0.0, flags=PREPROCESS_FLAGS)


def test_training_overrides_over_the_sidecars():
    sidecar = LossWeights(terminal=0.1, context=1.0)
    assert LossWeights().over(sidecar) == sidecar
    assert LossWeights(terminal=0.5).over(sidecar) == LossWeights(terminal=0.5, context=1.0)
    assert LossWeights(context=0.0).over(sidecar) == LossWeights(terminal=0.1, context=0.0)


def test_layout_and_window_hold_one_value():
    layout = LayoutConfig(seq_length=16, target_length=64,
                          loss_weights=LossWeights(terminal=0.25, context=0.5))
    header = layout.to_header()
    # the on-disk form is the flat one sidecars have always had
    assert set(header) == set(LAYOUT_HEADER_KEYS) == {
        "seq_length", "target_length", "placement", "pose_chunks", "terminal_loss_weight",
        "context_loss_weight"}
    assert (header["terminal_loss_weight"], header["context_loss_weight"]) == (0.25, 0.5)
    assert LayoutConfig.from_header(header) == layout
    assert LayoutConfig(seq_length=16, target_length=64).loss_weights == \
        LossWeights(terminal=1.0, context=1.0)
    with pytest.raises(ValueError, match="both loss weights"):
        LayoutConfig(seq_length=16, target_length=64, loss_weights=LossWeights(terminal=0.5))
    window = EndPromptWindow(target_length=64, loss_weights=LossWeights(context=0.0))
    assert window.loss_weights.terminal is None and window.loss_weights.context == 0.0
