"""``TerminalSpec``: the terminal flags validated once, for preprocessing, sidecar building
and the CLIs."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_endprompt.data.sidecar.terminal_spec import TerminalSpec
from megatron_endprompt.layout import LayoutConfig


def test_values_are_checked_on_construction():
    with pytest.raises(ValueError, match="--terminal-source must be one of"):
        TerminalSpec(source="middle", length=4)
    with pytest.raises(ValueError, match="--terminal-source continuation needs --terminal-length"):
        TerminalSpec(source="continuation")
    for source in ("continuation", "document-tail"):  # prompts would be silently ignored
        with pytest.raises(ValueError, match="--terminal-prompts ep1-3 is used only with "
                                             "--terminal-source prompt"):
            TerminalSpec(source=source, length=4, prompts="ep1-3")
    for seed in (-1, 2**63):
        with pytest.raises(ValueError, match=r"--seed .* must be in \[0, 2\*\*63\)"):
            TerminalSpec(length=4, seed=seed)
    assert TerminalSpec(length=4, seed=2**63 - 1).seed == 2**63 - 1


def test_prompt_terminals_have_no_b():
    spec = TerminalSpec(source="prompt", length=8, prompts="ep1-3")
    assert spec.length is None and spec.is_prompt
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 1


def test_b_is_checked_against_the_layout():
    layout = LayoutConfig(seq_length=32, target_length=256)
    TerminalSpec(length=8).check(layout)
    TerminalSpec(source="prompt").check(layout)  # prompts are checked once tokenized
    with pytest.raises(ValueError):
        TerminalSpec(length=32).check(layout)
