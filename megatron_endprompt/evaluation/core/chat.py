"""Chat templates for instruct models (``--chat-template model``).

Base models get prompts as text (RULER, LongBench and lm-eval do so by default). An instruct
model expects its chat template around the user turn; without it, it may answer nothing or
chat prose. ``--chat-template model`` wraps a prompt as one user message with the tokenizer's
own template and the assistant header (``apply_chat_template(..., add_generation_prompt=True)``).
The rendered text already holds the special tokens the template writes (e.g. BOS), so it is
tokenized without adding them again.

Where it applies: LongBench by its own rule for chat models (``pred.py``: every task except
``trec``, ``triviaqa``, ``samsum``, ``lsht``, ``lcc`` and ``repobench-p``, "chat models are
better off without build prompts on these tasks"; the wrap comes after the middle truncation);
short text (lm-eval's own ``apply_chat_template`` for MMLU / GSM8K / HellaSwag, the same wrap
for HumanEval's prompt); ``--backend lm-eval`` (lm-eval's ``apply_chat_template``). RULER and
passkey prompts stay base (RULER's ``base`` template, as for the paper's base models).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from megatron_endprompt.errors import UserError

__all__ = ["MODES", "has_chat_template", "chat_ids", "warning", "base_tasks_note",
           "check_setting"]

MODES = ("none", "model")


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer ships a chat template (an instruct / chat model)."""
    return bool(getattr(tokenizer, "chat_template", None))


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    """Ids of ``text`` as one user turn in the tokenizer's chat template, the assistant header
    after it (special tokens as the template writes them, none added)."""
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                             tokenize=False, add_generation_prompt=True)
    return list(tokenizer(rendered, add_special_tokens=False, verbose=False)["input_ids"])


def warning(hf_dir: str) -> str:
    """The one line printed when the tokenizer has a template and the run does not use it."""
    return (f"warning: the tokenizer in {hf_dir} ships a chat template (an instruct model?); "
            "prompts go in without it (--chat-template none); give --chat-template model to "
            "wrap LongBench, short-text and lm-eval prompts in it")


def base_tasks_note(tasks: list[str]) -> str:
    """The one line printed when ``--chat-template model`` meets tasks whose prompts stay base
    (every row of the task table: RULER, passkey, the legacy prompts), so a table of an
    instruct model does not read as if every prompt had been wrapped."""
    return (f"note: --chat-template model wraps LongBench, short-text and lm-eval prompts; "
            f"{', '.join(tasks)} stay base (RULER's base template, as for the paper's base "
            "models)")


def check_setting(mode: str, hf_dir: str, tokenizer: Any, log: Callable[[str], None]) -> None:
    """``--chat-template model`` needs a template (``UserError``); ``none`` on a tokenizer that
    has one logs :func:`warning`."""
    if mode == "model" and not has_chat_template(tokenizer):
        raise UserError(f"--chat-template model: the tokenizer in {hf_dir} has no chat "
                        "template (a base model); drop the flag or use --chat-template none")
    if mode == "none" and has_chat_template(tokenizer):
        log(warning(hf_dir))
