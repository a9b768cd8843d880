"""The row type of the task table: what one generation task declares, once.

A generation task (RULER's, passkey, the legacy prompts, or a new one) is one
:class:`GenerationTask`: its prompt builder, its scorer, its length rule and the resources its
builder reads. The pipeline (``suite.run_eval``) knows tasks only through these rows
(``task_table.TASKS``): it loads every resource the run's tasks name once, checks every length
rule before the model loads, then builds, generates and scores each task x length.

Why resources are rows' fields, not the builders' own business: several tasks share one (the
essay haystack of five RULER tasks is read once), and every one is loaded, and refused in one
line, before the model loads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from megatron_endprompt.evaluation.core.config import EvalConfig
from megatron_endprompt.evaluation.core.prompt import PromptSample, TextTokens
from megatron_endprompt.evaluation.core.scoring import Scorer

__all__ = ["TaskContext", "Resource", "GenerationTask", "no_requirement"]


@dataclass(kw_only=True, frozen=True)
class TaskContext:
    """What prompt builders, length rules and resource loaders receive."""

    cfg: EvalConfig
    """The run's choices (``samples``, ``seed``, ``depths``, the data flags)."""
    tokens: TextTokens
    """The model's tokenizer as prompt texts are tokenized (special tokens added)."""
    resources: Mapping[str, Any] = field(default_factory=dict)
    """Loaded resources by :attr:`Resource.name` (empty while they are being loaded)."""


def no_requirement(cfg: EvalConfig) -> str | None:
    """The requirement of a resource that needs no flag."""
    return None


@dataclass(kw_only=True, frozen=True)
class Resource:
    """Data several tasks may share, loaded once per run, after the tokenizer and before the
    model."""

    name: str
    """Key under :attr:`TaskContext.resources`."""
    load: Callable[[TaskContext, tuple[str, ...]], Any]
    """``load(ctx, tasks)``: the resource for the run's ``tasks`` that name it; raises
    ``UserError`` naming the flag and the fix for a missing or malformed file."""
    requires: Callable[[EvalConfig], str | None] = no_requirement
    """The one-line refusal when the flags cannot provide it (e.g. a data directory flag not
    given), checked with the other flags before anything loads; ``None`` when they can."""


@dataclass(kw_only=True, frozen=True)
class GenerationTask:
    """One generation task: prompts built per length, greedy continuations scored."""

    name: str
    """``--tasks`` name (also the results' and the table's key)."""
    build: Callable[[TaskContext, str, int], list[PromptSample]]
    """``build(ctx, name, length)``: the prompt samples at ``length`` (prompt + generation
    budget <= ``length``); ``ValueError`` when the length cannot hold one."""
    scorer: Scorer
    """``scorer(prediction, references)``: one sample's score in [0, 1] (the task's score is
    the mean x 100)."""
    check_length: Callable[[TaskContext, str, int], None] | None = None
    """The length rule: ``check_length(ctx, name, length)`` raises ``ValueError`` (the reason)
    when ``length`` cannot hold the task's prompt; run for every length before the model
    loads. ``None``: ``build`` is cheap enough to be the check."""
    resources: tuple[Resource, ...] = ()
    """What ``build`` and ``check_length`` read from :attr:`TaskContext.resources`."""
