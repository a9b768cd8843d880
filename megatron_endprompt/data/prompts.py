"""Terminal prompts: the short texts that close a sample when ``--terminal-source prompt``."""

from __future__ import annotations

from typing import Any

import numpy as np

from megatron_endprompt.errors import UserError

EOD_PROMPT = "<eod>"
"""Stands for the tokenizer's end-of-document token (``<|eot_id|>``/EOS), a single token."""

BUILTIN_PROMPTS: tuple[str, ...] = (
    "This is the end of text, please pay attention here.",
    EOD_PROMPT,
    "End.",
)


def load_prompts(path: str | None) -> list[str]:
    """Prompts from ``path`` (one per line, blank lines ignored), else the built-in set."""
    if path is None:
        return list(BUILTIN_PROMPTS)
    try:
        with open(path, encoding="utf-8") as f:
            prompts = [line.rstrip("\r\n") for line in f if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--terminal-prompts {path}: cannot read ({exc}); give a UTF-8 text "
                        "file with one prompt per line") from None
    if not prompts:
        raise UserError(f"--terminal-prompts {path}: no prompt in the file; "
                        "write one prompt per line")
    return prompts


def tokenize_prompts(prompts: list[str], tokenizer: Any) -> list[np.ndarray]:
    """Token ids of each prompt; :data:`EOD_PROMPT` maps to ``[tokenizer.eod]``."""
    out = []
    for prompt in prompts:
        ids = [tokenizer.eod] if prompt == EOD_PROMPT else tokenizer.tokenize(prompt)
        if len(ids) == 0:
            raise UserError(f"--terminal-prompts: prompt {prompt!r} tokenizes to nothing")
        out.append(np.asarray(ids, dtype=np.int64))
    return out
