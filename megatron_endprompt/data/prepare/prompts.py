"""Terminal prompts: the short texts that close a sample when ``--terminal-source prompt``.

Prompts are spliced into the middle of the token stream, so they are tokenized with *no*
special tokens added (:func:`~megatron_endprompt.data.tokenize.tokenizer.encode_plain`): a Llama-3
tokenizer would otherwise start every terminal with ``<|begin_of_text|>``.

Defaults follow the paper (arXiv 2605.14589): ``--terminal-prompts`` names a built-in set or a
file. The default set ``ep1`` is EP1 alone (the paper's main result); ``ep1-3`` is the uniform
EP1-EP3 mixture of its ablation. Their default loss weight lives with the weights
(:class:`~megatron_endprompt.loss_weights.LossWeights`).

Which token EP2 (the end-of-text prompt) is:

* the built-in set's ``<eot>`` line is the paper's EP2, ``<|eot_id|>``, where the tokenizer has
  that token, else the tokenizer's end-of-document token (the preprocessing summary says which);
* a ``<eod>`` line is the tokenizer's end-of-document token, Megatron's
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

from megatron_endprompt.data.tokenize.tokenizer import encode_plain, token_text

EOD_PROMPT = "<eod>"
"""Stands for the tokenizer's end-of-document token ``tokenizer.eod``
(its ``eos_token``), one id."""

EOT_PROMPT = "<eot>"
"""The paper's EP2: ``<|eot_id|>`` where the tokenizer has it, else ``tokenizer.eod``; one id."""

EOT_TOKEN = "<|eot_id|>"
"""The token the paper's EP2 is (Llama-3's end-of-turn token)."""

EP1 = "This is the end of text, please pay attention here."
"""The paper's EP1, its main configuration."""

PROMPT_SETS: dict[str, tuple[str, ...]] = {
    "ep1": (EP1,),
    "ep1-3": (EP1, EOT_PROMPT, "End."),
}
"""Built-in prompt sets by ``--terminal-prompts`` name: EP1 alone, and EP1, EP2, EP3 in the
paper's order (its uniform mixture)."""

DEFAULT_PROMPT_SET = "ep1"
"""``--terminal-prompts`` when not given: EP1 alone, as the paper's main result."""

BUILTIN_PROMPTS: tuple[str, ...] = PROMPT_SETS["ep1-3"]
"""EP1, EP2 and EP3 of the EndPrompt paper, in its order."""


def eot_id(tokenizer: Any) -> int | None:
    """The id of ``<|eot_id|>`` when the tokenizer has it as one token, else ``None``."""
    ids = encode_plain(tokenizer, EOT_TOKEN)
    if len(ids) == 1 and token_text(tokenizer, ids[0]) == EOT_TOKEN:
        return int(ids[0])
    return None


def ep2_note(tokenizer: Any) -> str:
    """What the built-in EP2 (``<eot>``) is under ``tokenizer``, for the summary."""
    if eot_id(tokenizer) is not None:
        return f"{EOT_TOKEN} (the paper's EP2)"
    name = token_text(tokenizer, tokenizer.eod)
    return (f"the tokenizer's end token {name or tokenizer.eod!r} (it has no {EOT_TOKEN}, "
            "the paper's EP2)")

_SPECIAL_SHAPE = re.compile(r"<\|[^|\s]+\|>")


def load_prompts(path: str | None) -> list[str]:
    """Prompts of the built-in set named ``path`` (``None``: :data:`DEFAULT_PROMPT_SET`), else
    from the file ``path`` (one per line, blank lines ignored)."""
    if path is None:
        path = DEFAULT_PROMPT_SET
    if path in PROMPT_SETS:
        return list(PROMPT_SETS[path])
    try:
        with open(path, encoding="utf-8") as f:
            prompts = [line.rstrip("\r\n") for line in f if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--terminal-prompts {path}: cannot read ({exc}); give a UTF-8 text "
                        "file with one prompt per line, or a built-in set: "
                        f"{', '.join(PROMPT_SETS)}") from None
    if not prompts:
        raise UserError(f"--terminal-prompts {path}: no prompt in the file; "
                        "write one prompt per line")
    return prompts


def tokenize_prompt(prompt: str, tokenizer: Any) -> np.ndarray:
    """Token ids (int64) of one prompt, no special token added; see the module docstring."""
    if prompt == EOD_PROMPT:
        ids = [tokenizer.eod]
    elif prompt == EOT_PROMPT:
        eot = eot_id(tokenizer)
        ids = [tokenizer.eod if eot is None else eot]
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
