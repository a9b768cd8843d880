"""Passkey as landmark attention / PoSE (needle on its own line, fits the length)."""

from __future__ import annotations

import pytest

from megatron_endprompt.evaluation.core.prompt import TextTokens
from megatron_endprompt.evaluation.passkey import passkey


def test_passkey_prompt_lines_and_length(hf_tokenizer):
    made = passkey.make_passkey_samples(TextTokens(hf_tokenizer), lengths=[300, 700],
                                        depths=[0.0, 0.5, 1.0], samples=2, seed=3)
    assert len(made) == 2 * 3 * 2
    for s in made:
        lines = s.prompt.split("\n")
        key = int(s.answers[0])
        assert 1 <= key <= 50000
        # landmark attention: five lines, the key line on its own
        assert lines[0] == passkey.TASK_DESCRIPTION and lines[4] == passkey.FINAL_QUESTION
        assert lines[2] == f"The pass key is {key}. Remember it. {key} is the pass key."
        n = s.extra["garbage_chars"]
        assert len(lines[1]) == int(n * s.depth) and len(lines[1]) + len(lines[3]) == n
        assert (lines[1] + " " + passkey.GARBAGE).startswith(lines[1])
        assert passkey.GARBAGE.startswith(lines[3][:len(passkey.GARBAGE)])
        assert len(s.input_ids) + s.max_new_tokens <= s.length
        assert len(s.input_ids) + s.max_new_tokens > s.length - 12  # filled by characters
        assert s.input_ids[0] == hf_tokenizer.bos_token_id


def test_passkey_too_short(hf_tokenizer):
    with pytest.raises(ValueError, match="passkey: length 40 is too short"):
        passkey.make_passkey_samples(TextTokens(hf_tokenizer), lengths=[40], depths=[0.5],
                                     samples=1, seed=0)
