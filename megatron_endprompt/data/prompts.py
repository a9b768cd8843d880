"""Terminal prompts: the short texts that close a sample when ``--terminal-source prompt``.

Prompts are spliced into the middle of the token stream, so they are tokenized with *no*
special tokens added (:func:`~megatron_endprompt.data.tokenizer.encode_plain`): a Llama-3
tokenizer would otherwise start every terminal with ``<|begin_of_text|>``.

Which token EP2 (the end-of-text prompt) is:

* the built-in ``<eod>`` line is the tokenizer's end-of-document token, Megatron's
  ``tokenizer.eod`` — for a Hugging Face tokenizer its ``eos_token``: ``<|end_of_text|>`` for
  a Llama-3 *base* tokenizer, ``<|eot_id|>`` for an *instruct* one (Meta's configs);
* a prompt-file line that is exactly a special token's string (``<|eot_id|>``,
  ``<|end_of_text|>``) is that single token, whatever the tokenizer's ``eos_token`` is. A line
  shaped like one (``<|...|>``) that the tokenizer does not know is refused.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from megatron_endprompt.errors import UserError

EOD_PROMPT = "<eod>"
"""Stands for the tokenizer's end-of-document token ``tokenizer.eod`` (its ``eos_token``), one id."""

BUILTIN_PROMPTS: tuple[str, ...] = (
    "This is the end of text, please pay attention here.",
    EOD_PROMPT,
    "End.",
)
"""EP1, EP2 and EP3 of the EndPrompt paper, in its order."""

_SPECIAL_SHAPE = re.compile(r"<\|[^|\s]+\|>")


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


def tokenize_prompt(prompt: str, tokenizer: Any) -> np.ndarray:
    """Token ids (int64) of one prompt, no special token added; see the module docstring."""
    from megatron_endprompt.data.tokenizer import encode_plain

    if prompt == EOD_PROMPT:
        ids = [tokenizer.eod]
    else:
        special = _SPECIAL_SHAPE.fullmatch(prompt.strip()) is not None
        ids = encode_plain(tokenizer, prompt.strip() if special else prompt)
        if special and len(ids) != 1:
            raise UserError(
                f"--terminal-prompts: {prompt!r} looks like a special token but the tokenizer "
                f"has no such token (it gives {len(ids)} ids); use one of the tokenizer's "
                f"special tokens or {EOD_PROMPT} for its end token")
    if len(ids) == 0:
        raise UserError(f"--terminal-prompts: prompt {prompt!r} tokenizes to nothing")
    return np.asarray(ids, dtype=np.int64)


def tokenize_prompts(prompts: list[str], tokenizer: Any) -> list[np.ndarray]:
    """:func:`tokenize_prompt` of each prompt."""
    return [tokenize_prompt(p, tokenizer) for p in prompts]
