"""A generation prompt as the runner consumes it, and the tokenizer view the prompt builders
share.

Prompts of the RULER and passkey tasks are built as text and tokenized once, as RULER's HF
wrapper does (``tokenizer(prompt)``: special tokens included, so a Llama tokenizer puts BOS
first). Their length is the number of ids the model receives; the protocol keeps
``len(input_ids) + max_new_tokens <= length``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["PromptSample", "TextTokens"]


@dataclass(kw_only=True, frozen=True)
class PromptSample:
    """One prompt to continue greedily and score.

    ``prompt`` is the text (``None`` for legacy token-built prompts, decoded when saved);
    ``input_ids`` the ids fed to the model (an int32 array for text prompts: 500 RULER prompts
    of 64K tokens take 128 MB, not the 1.2 GB of Python ints); ``answers`` the references of
    ``metric`` (a key of ``scoring.METRICS``, or a label when the task table's scorer scores
    the task); ``max_new_tokens`` the generation budget; ``depth`` the needle
    depth in [0, 1] when the task has a needle (the heatmap's rows)."""

    task: str
    length: int
    index: int
    input_ids: Sequence[int]
    answers: tuple[str, ...]
    metric: str
    max_new_tokens: int
    prompt: str | None = None
    depth: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class TextTokens:
    """Token ids and counts of whole prompt texts under an HF tokenizer (or anything with
    ``__call__(text, add_special_tokens=...)`` returning ``{"input_ids": [...]}``)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> tuple[int, ...]:
        """Ids the model receives for ``text`` (special tokens added as the tokenizer does)."""
        return tuple(self.tokenizer(text, add_special_tokens=True, verbose=False)["input_ids"])

    def array(self, text: str) -> np.ndarray:
        """``encode(text)`` as a compact int32 array (what samples keep)."""
        return np.asarray(self.encode(text), dtype=np.int32)

    def count(self, text: str) -> int:
        """``len(encode(text))``."""
        return len(self.encode(text))
