"""Passkey's and the legacy prompts' rows of the task table."""

from __future__ import annotations

from typing import Any

from megatron_endprompt.evaluation.core.prompt import PromptSample
from megatron_endprompt.evaluation.core.scoring import METRICS
from megatron_endprompt.evaluation.core.task import GenerationTask, Resource, TaskContext
from megatron_endprompt.evaluation.passkey import legacy, passkey

__all__ = ["LEGACY_TASKS", "LEGACY_TOKENS", "rows"]

LEGACY_TASKS = ("legacy_passkey", "legacy_niah_single", "legacy_niah_multikey",
                "legacy_niah_multivalue", "legacy_niah_multiquery")


def _passkey(ctx: TaskContext, name: str, length: int) -> list[PromptSample]:
    return passkey.make_passkey_samples(ctx.tokens, lengths=[length], depths=ctx.cfg.depths,
                                        samples=ctx.cfg.samples or 0, seed=ctx.cfg.seed)


def _passkey_fits(ctx: TaskContext, name: str, length: int) -> None:
    need = ctx.tokens.count(passkey.passkey_prompt(50000, 0, 0.5))
    if need + passkey.MAX_NEW_TOKENS > length:
        raise ValueError(f"passkey: length {length} is too short (the prompt without garbage "
                         f"takes {need} tokens)")


def _legacy_tokens(ctx: TaskContext, tasks: tuple[str, ...]) -> dict[str, Any]:
    return {"tokens": legacy.PromptTokens(ctx.tokens.tokenizer), "fillers": {}}


#: The legacy prompts' piece tokenizer and filler cache (shared by the five tasks).
LEGACY_TOKENS = Resource(name="legacy_prompt_tokens", load=_legacy_tokens)


def _legacy(ctx: TaskContext, name: str, length: int) -> list[PromptSample]:
    """The pre-RULER prompts (inline passkey needle, grammar haystack), kept under
    ``legacy_*`` names for comparison with old results."""
    cache = ctx.resources[LEGACY_TOKENS.name]
    made = legacy.make_samples(name[len("legacy_"):], cache["tokens"], lengths=[length],
                               depths=ctx.cfg.depths, samples=ctx.cfg.samples or 0,
                               seed=ctx.cfg.seed, fillers=cache["fillers"])
    return [PromptSample(task=name, length=s.length, index=s.index, input_ids=s.input_ids,
                         answers=s.answers, metric=s.metric, max_new_tokens=s.max_new_tokens,
                         depth=s.depth) for s in made]


def _legacy_fits(ctx: TaskContext, name: str, length: int) -> None:
    tokens = ctx.resources[LEGACY_TOKENS.name]["tokens"]
    over = legacy.prompt_overhead(name[len("legacy_"):], tokens)
    if length <= over:
        raise ValueError(f"{name}: too short; its prompt without haystack takes {over} tokens")


def rows() -> list[GenerationTask]:
    """The passkey row, then the five legacy rows."""
    out = [GenerationTask(name="passkey", build=_passkey, check_length=_passkey_fits,
                          scorer=METRICS["passkey_exact"])]
    return out + [GenerationTask(name=name, build=_legacy, check_length=_legacy_fits,
                                 scorer=METRICS["passkey_exact" if name == "legacy_passkey"
                                                else "string_match_all"],
                                 resources=(LEGACY_TOKENS,)) for name in LEGACY_TASKS]
