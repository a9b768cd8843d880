"""``EndPromptWindow``: the one place L, L0, s and the loss weights are resolved and validated."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_endprompt.window import (
    EXPORT_FLAGS,
    LAUNCH_FLAGS,
    PREPROCESS_FLAGS,
    EndPromptWindow,
    resolve_pi_factor,
)


def test_resolves_s_from_the_original_window_and_is_frozen():
    w = EndPromptWindow(target_length=65536, seq_length=4096, original_length=8192)
    assert w.pi_factor == 8.0
    assert EndPromptWindow(target_length=40000, original_length=8192).pi_factor == 5.0
    assert EndPromptWindow(target_length=65536, original_length=8192, pi_factor=4).pi_factor == 4.0
    assert EndPromptWindow(target_length=512, seq_length=64).pi_factor is None  # no model yet
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.pi_factor = 2.0
    with pytest.raises(TypeError):
        EndPromptWindow(65536)  # keyword-only


@pytest.mark.parametrize("flags", [None, PREPROCESS_FLAGS, EXPORT_FLAGS, LAUNCH_FLAGS])
def test_target_length_equal_to_the_original_window_is_s_1(flags):
    """``L = L0``: fine-tuning at the model's own window (no interpolation) is a legal run."""
    kw = {"flags": flags} if flags else {}
    w = EndPromptWindow(target_length=8192, seq_length=64, original_length=8192, **kw)
    assert (w.target_length, w.original_length, w.pi_factor) == (8192, 8192, 1.0)
    assert EndPromptWindow(target_length=8192, original_length=8192, pi_factor=1.0,
                           **kw).pi_factor == 1.0


@pytest.mark.parametrize("kwargs, flags, message", [
    (dict(target_length=4096, seq_length=4096), None,
     "L=4096 must be larger than seq length P=4096; raise --endprompt-target-length"),
    (dict(target_length=4096, seq_length=4096), PREPROCESS_FLAGS,
     "raise --target-length or lower --seq-length"),
    (dict(target_length=512, seq_length=1), None, "P=1 must be >= 2 \\(--seq-length\\)"),
    (dict(target_length=4096, original_length=8192), None,
     "L=4096 \\(--endprompt-target-length\\) is below the original context window 8192 "
     ".*raise --endprompt-target-length to 8192 .*--endprompt-original-length"),
    (dict(target_length=4096, original_length=8192), EXPORT_FLAGS,
     "L=4096 \\(--target-length\\) is below the original context window 8192"),
    (dict(target_length=4096, original_length=8192), LAUNCH_FLAGS,
     "L=4096 \\(TARGET_LENGTH\\) is below .*raise TARGET_LENGTH to 8192 .*ORIGINAL_LENGTH"),
    (dict(target_length=65536, original_length=8192, pi_factor=0.5), EXPORT_FLAGS,
     "s=0.5 must be finite and >= 1 \\(--pi-factor\\)"),
])
def test_validation_names_the_flag(kwargs, flags, message):
    with pytest.raises(ValueError, match=message):
        EndPromptWindow(**kwargs, **({"flags": flags} if flags else {}))


def test_pi_factor_from_either_flag():
    assert resolve_pi_factor(None, None) == 1.0
    assert resolve_pi_factor(None, 4.0) == 4.0
    assert resolve_pi_factor(8, 8.0) == 8.0
    assert resolve_pi_factor(8, 1.0) == 8.0  # Megatron's 1 means "off"
    with pytest.raises(ValueError, match="--endprompt-pi-factor.*disagrees.*"
                                         "--rotary-seq-len-interpolation-factor"):
        resolve_pi_factor(8.0, 4.0)

