"""Evaluation of the extension protocol: the evaluator's two retrieval templates, each prompt
filling its stated length.

The evaluator's own builders fit a prompt to ``length - generated tokens`` in whole haystack
units (RULER's noise unit is ~25 tokens) and reserve RULER's 128 generated tokens, so "NIAH at
640" was a 465-489-token prompt. Here each prompt is the same template -- RULER
``niah_single_1`` (its singular template, noise haystack, 7-digit value) or landmark passkey --
with its filler cut by characters (bisection) so that ``prompt + budget`` lies in
``[(1 - FILL_TOLERANCE) x length, length]``, with short generation budgets (:data:`NIAH_BUDGET`,
passkey's own 10): every sample is checked, and a length that cannot be filled is refused.
The scoring is the evaluator's (``scoring.score``: RULER's ``string_match_all``, landmark's
first integer). Keys and values are drawn from ``eval:{seed}:...`` generators, distinct from
every training document's.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from megatron_endprompt.evaluation.passkey import passkey as PK
from megatron_endprompt.evaluation.core import runner
from megatron_endprompt.evaluation.core.prompt import PromptSample, TextTokens
from megatron_endprompt.evaluation.perplexity import windows as perplexity
from megatron_endprompt.evaluation.ruler.niah import niah_template
from megatron_endprompt.evaluation.ruler.sources import random_value
from megatron_endprompt.evaluation.ruler.spec import NIAH_NEEDLE, NOISE_HAYSTACK, RULER_TASKS

#: A prompt plus its generation budget falls short of its stated length by at most this share.
FILL_TOLERANCE = 0.02
#: Tokens generated for a 7-digit NIAH value (a piece per digit, the period, spare).
NIAH_BUDGET = 12
TASKS = ("niah_single_1", "passkey")
PASSKEY_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
_NIAH = RULER_TASKS["niah_single_1"]


@dataclass(kw_only=True, frozen=True)
class EvalPlan:
    """What every row is evaluated on."""

    lengths: tuple[int, ...]
    """Stated lengths, ``(L0, L)``."""
    samples: int
    """Prompts per task and length (passkey: spread over :data:`PASSKEY_DEPTHS`)."""
    seed: int = 42
    """Seed of the prompts' keys, values and depths (the same prompts for every row)."""
    batch: int = 20
    """Prompts per generation batch."""


def _fill(text_of, count, budget: int, hi: int) -> str:
    chars = PK.largest_fitting(lambda c: count(text_of(c)) <= budget, hi)
    if chars is None:
        raise ValueError("the template alone exceeds the length")
    return text_of(chars)


def niah_prompt(tokens: TextTokens, length: int, rng: random.Random, depth: float):
    """One NIAH prompt (RULER's singular template with its answer prefix) whose ids plus
    :data:`NIAH_BUDGET` fill ``length``; returns ``(text, value)``."""
    template, type_v = niah_template(_NIAH)
    key, value = random_value(rng, "words"), random_value(rng, "numbers")
    needle = NIAH_NEEDLE.format(type_needle_v=type_v + "s", key=key, value=value)
    noise = "\n".join([NOISE_HAYSTACK] * (length // 4 + 8))

    def text(chars: int) -> str:
        hay = noise[:chars]
        cut = hay.rfind("\n", 0, int(len(hay) * depth) + 1)
        at = 0 if cut < 0 else cut + 1
        return template.format(type_needle_v=type_v, query=key,
                               context=hay[:at] + needle + "\n" + hay[at:])
    return _fill(text, tokens.count, length - NIAH_BUDGET, len(noise)), value


def passkey_text(tokens: TextTokens, length: int, key: int, depth: float) -> str:
    """Landmark's passkey prompt whose ids plus passkey's budget fill ``length``."""
    return _fill(lambda c: PK.passkey_prompt(key, c, depth), tokens.count,
                 length - PK.MAX_NEW_TOKENS, 8 * length)


def build_samples(tokens: TextTokens, plan: EvalPlan) -> list[PromptSample]:
    """Every prompt of the plan; refuses one that does not fill its length within
    :data:`FILL_TOLERANCE`."""
    out: list[PromptSample] = []
    for n in plan.lengths:
        for i in range(plan.samples):
            rng = random.Random(f"eval:{plan.seed}:niah:{n}:{i}")
            depth = (i + 0.5) / plan.samples
            text, value = niah_prompt(tokens, n, rng, depth)
            out.append(PromptSample(task="niah_single_1", length=n, index=i,
                                    input_ids=tokens.array(text), answers=(value,),
                                    metric=_NIAH.metric, max_new_tokens=NIAH_BUDGET,
                                    prompt=text, depth=depth))
        for i in range(plan.samples):
            rng = random.Random(f"eval:{plan.seed}:passkey:{n}:{i}")
            key, depth = rng.randint(1, 50000), PASSKEY_DEPTHS[i % len(PASSKEY_DEPTHS)]
            text = passkey_text(tokens, n, key, depth)
            out.append(PromptSample(task="passkey", length=n, index=i,
                                    input_ids=tokens.array(text), answers=(str(key),),
                                    metric="passkey_exact", max_new_tokens=PK.MAX_NEW_TOKENS,
                                    prompt=text, depth=depth))
    for s in out:
        used = len(s.input_ids) + s.max_new_tokens
        if not (1 - FILL_TOLERANCE) * s.length <= used <= s.length:
            raise ValueError(f"{s.task} at {s.length}: prompt {len(s.input_ids)} + budget "
                             f"{s.max_new_tokens} does not fill the length within "
                             f"{100 * FILL_TOLERANCE:g}%")
    return out


def fill_stats(samples: list[PromptSample]) -> dict:
    """``{task: {length: [min, max] prompt tokens}}`` (stored with the results)."""
    out: dict = {}
    for s in samples:
        lo, hi = out.setdefault(s.task, {}).get(str(s.length), (10 ** 9, 0))
        out[s.task][str(s.length)] = (min(lo, len(s.input_ids)), max(hi, len(s.input_ids)))
    return {t: {n: list(v) for n, v in d.items()} for t, d in out.items()}


def evaluate(model, tok, samples: list[PromptSample], plan: EvalPlan) -> dict:
    """Greedy answers of an HF causal LM (in eval mode) to ``samples``; returns
    ``{"counts": {task: {length: [k, n]}}, "eval_s": seconds}``."""
    t0 = time.time()
    records = runner.run_generation(model, tok, samples, batch_size=plan.batch)
    counts: dict = {}
    for r in records:
        k, m = counts.setdefault(r["task"], {}).get(str(r["length"]), (0.0, 0))
        counts[r["task"]][str(r["length"])] = [k + float(r["score"] or 0.0), m + 1]
    return {"counts": counts, "eval_s": round(time.time() - t0, 1)}


def heldout_ppl(model, tok, path: str, *, lengths: tuple[int, ...], stride: int,
                doc_tokens: int) -> dict:
    """Perplexity of an HF causal LM on the held-out documents of ``path`` (JSONL), per length,
    with the evaluator's per-document protocol (``perplexity.run_doc_perplexity``: BOS first,
    windows of ``length`` tokens every ``stride``, each token scored once with the window
    before it as context): every document cut to ``doc_tokens`` tokens, so each length scores
    the same tokens. ``{length: {"ppl", "nll", "tokens", "windows", "docs", ...}}``."""
    docs = perplexity.tokenize_documents(tok, perplexity.load_documents(path),
                                         max_tokens=doc_tokens)
    short = [len(d) for d in docs if len(d) < doc_tokens]
    if short:
        raise ValueError(f"{path}: {len(short)} document(s) shorter than {doc_tokens} tokens")
    return {str(n): perplexity.run_doc_perplexity(model, docs, length=n, stride=stride)
            for n in lengths}
