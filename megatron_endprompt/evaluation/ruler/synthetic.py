"""RULER's length protocol and the samples of a RULER run.

RULER (``niah.py`` ``generate_samples``, ``variable_tracking.py``
``sys_vartrack_w_noise_random``, ``common_words_extraction.py`` ``sys_word_pair_random``) sizes
the haystack per task and length: estimate tokens per haystack unit from a small prompt,
binary-search the largest unit count ``n`` (from one increment up) with ``tokens(prompt) +
tokens_to_generate <= length``, then render each sample with ``n`` units. ``vt`` estimates the
tokens per unit on a prompt without its in-context example (``variable_tracking.py`` counts the
example's tokens separately), so the search's upper bound is not cut by the ~500 tokens of the
example. Where a sample (other needles, other random names) does not fit with ``n`` units, RULER
steps down by the whole increment (500 essay words: a sixth of a 4K prompt); we take the largest
smaller ``n`` that fits instead (a binary search), so every prompt fills its length as far as
its units allow. ``fwe`` grows and shrinks its word count instead (``ruler_aggregate``).

We count the ids the model receives (BOS included), one more than RULER's
``tokenizer.tokenize`` count for a Llama tokenizer, so the guarantee holds for the real input.
Each sample draws from ``random.Random("seed:task:length:index")``: a prompt does not change
when other tasks, lengths or samples are added to a run.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from megatron_endprompt.evaluation.core.prompt import PromptSample, TextTokens
from megatron_endprompt.evaluation.ruler.aggregate import (TooManyWords, fit_fwe, fwe_vocab,
                                                           render_cwe, render_fwe)
from megatron_endprompt.evaluation.ruler.niah import (Rendered, render_niah, render_vt,
                                                      vt_icl_example)
from megatron_endprompt.evaluation.ruler.sources import Haystack
from megatron_endprompt.evaluation.ruler.spec import RULER_TASKS, RulerTask

__all__ = ["fit_haystack", "make_ruler_samples", "increment", "check_length"]

Render = Callable[[int], Rendered]


def increment(task: RulerTask, length: int) -> int:
    """RULER's haystack step: essay 500, noise/needle 25 (5 below 4096 tokens); vt 10 (5 below
    4096); cwe 10."""
    if task.kind == "common_words_extraction":
        return 10
    if task.kind == "variable_tracking":
        return 5 if length < 4096 else 10
    if task.haystack == "essay":
        return 500
    return 5 if length < 4096 else 25


def _fits(render: Render, n: int, count: Callable[[str], int], budget: int) -> bool:
    try:
        return count(render(n).text) <= budget
    except TooManyWords:
        return False


def fit_haystack(task: RulerTask, render: Render, count: Callable[[str], int], *,
                 length: int, estimate: Render | None = None) -> int:
    """The largest haystack size whose prompt + ``tokens_to_generate`` fits ``length`` (RULER's
    binary search; see the module docstring). ``estimate`` renders the prompt the tokens per
    unit are estimated on (default ``render``; ``vt``: without its in-context example). Raises
    ``ValueError`` when none fits."""
    inc = increment(task, length)
    budget = length - task.tokens_to_generate
    if task.kind == "common_words_extraction":
        probe = 4096  # RULER estimates cwe from a 4096-word prompt
        per_unit = count(render(probe).text) / probe
        upper = max(int(length // per_unit) * 2, inc * 2)
    else:
        per_unit = count((estimate or render)(inc).text) / inc
        upper = max(int(length / per_unit * 3), inc * 2)
    best = _search(render, count, budget, inc, upper)
    smallest = 1
    if task.kind == "variable_tracking":  # a chain needs one noise line per variable
        smallest = int(task.args["num_hops"]) + 1  # type: ignore[call-overload]
    if best is None:  # RULER would loop forever here; we try smaller haystacks first
        best = _search(render, count, budget, smallest, inc - 1)
    if best is None:
        raise ValueError(f"{task.name}: length {length} is too short: the prompt with the "
                         f"smallest haystack ({smallest} unit(s)) and "
                         f"{task.tokens_to_generate} generated tokens does not fit; use a "
                         "longer length")
    return best


def _search(render: Render, count: Callable[[str], int], budget: int, lower: int,
            upper: int) -> int | None:
    best = None
    while lower <= upper:
        mid = (lower + upper) // 2
        if _fits(render, mid, count, budget):
            best, lower = mid, mid + 1
        else:
            upper = mid - 1
    return best


def _renderer(task: RulerTask, rng: random.Random, *, seed: int, length: int,
              haystack: Haystack | None, icl: str | None) -> Render:
    if task.kind == "niah":
        return lambda n: render_niah(task, n, rng, seed=seed, haystack=haystack)
    if task.kind == "variable_tracking":
        return lambda n: render_vt(task, n, rng, icl_example=icl)
    if task.kind == "common_words_extraction":
        return lambda n: render_cwe(task, n, rng, seed=seed, length=length)
    raise ValueError(f"no haystack renderer for {task.kind}")


def _vt_icl(task: RulerTask, tokens: TextTokens, seed: int) -> str:
    """RULER's vt example: one prompt fitted to 500 tokens (no generation budget, step 5)."""
    rng = random.Random(f"{seed}:{task.name}:icl")
    render = lambda n: render_vt(task, n, rng, icl=True)  # noqa: E731
    best, lower, upper = None, 5, 200
    while lower <= upper:
        mid = (lower + upper) // 2
        if tokens.count(render(mid).text) <= 500:
            best, lower = mid, mid + 1
        else:
            upper = mid - 1
    return vt_icl_example(render(best or 5))


def check_length(name: str, tokens: TextTokens, *, length: int, seed: int,
                 haystack: Haystack | None) -> None:
    """Raise ``ValueError`` when even the smallest haystack of task ``name`` does not fit
    ``length`` (a cheap check before any model runs)."""
    task = RULER_TASKS[name]
    rng = random.Random(f"{seed}:{name}:{length}:check")
    if task.kind == "freq_words_extraction":
        text = render_fwe(task, 0, fwe_vocab(rng, seed, 4), seed=seed).text
        smallest = 0
    else:
        icl = _vt_icl(task, tokens, seed) if task.kind == "variable_tracking" else None
        smallest = int(task.args["num_hops"]) + 1 if task.kind == "variable_tracking" \
            else 1  # type: ignore[call-overload]
        text = _renderer(task, rng, seed=seed, length=length, haystack=haystack,
                         icl=icl)(smallest).text
    need = tokens.count(text) + task.tokens_to_generate
    if need > length:
        raise ValueError(f"{name}: length {length} is too short: the prompt with the smallest "
                         f"haystack ({smallest} unit(s)) and {task.tokens_to_generate} "
                         f"generated tokens takes {need}; use a longer length")


def make_ruler_samples(name: str, tokens: TextTokens, *, lengths: list[int], samples: int,
                       seed: int, haystack: Haystack | None = None) -> list[PromptSample]:
    """``samples`` prompts of RULER task ``name`` per length (length-major order)."""
    task = RULER_TASKS[name]
    if task.haystack == "essay" and haystack is None:
        raise ValueError(f"{name} needs an essay haystack")
    icl = _vt_icl(task, tokens, seed) if task.kind == "variable_tracking" else None
    out: list[PromptSample] = []
    for length in lengths:
        fit_rng = random.Random(f"{seed}:{name}:{length}:fit")
        n = None
        if task.kind != "freq_words_extraction":
            estimate = None
            if task.kind == "variable_tracking":  # RULER: the bound without the example
                estimate = _renderer(task, fit_rng, seed=seed, length=length,
                                     haystack=haystack, icl=None)
            n = fit_haystack(task, _renderer(task, fit_rng, seed=seed, length=length,
                                             haystack=haystack, icl=icl),
                             tokens.count, length=length, estimate=estimate)
        else:
            _, n = fit_fwe(task, fit_rng, seed=seed, length=length, count=tokens.count)
        for index in range(samples):
            rng = random.Random(f"{seed}:{name}:{length}:{index}")
            rendered, used = _sample(task, rng, n, tokens, seed=seed, length=length,
                                     haystack=haystack, icl=icl)
            ids = tokens.array(rendered.text)
            assert len(ids) + task.tokens_to_generate <= length, (name, length, len(ids))
            out.append(PromptSample(task=name, length=length, index=index, input_ids=ids,
                                    answers=rendered.answers, metric=task.metric,
                                    max_new_tokens=task.tokens_to_generate,
                                    prompt=rendered.text, depth=rendered.depth,
                                    extra={"haystack_units": used}))
    return out


def _sample(task: RulerTask, rng: random.Random, n: int, tokens: TextTokens, *, seed: int,
            length: int, haystack: Haystack | None,
            icl: str | None) -> tuple[Rendered, int]:
    """One sample with ``n`` units or, where it does not fit, the largest smaller count that
    does (see the module docstring); returns it and the units it used. The sample's draws are
    replayed from the same state for every count tried, so its needles and names do not depend
    on the search."""
    if task.kind == "freq_words_extraction":
        return fit_fwe(task, rng, seed=seed, length=length, count=tokens.count, num_words=n)
    state = rng.getstate()
    budget = length - task.tokens_to_generate
    render = _renderer(task, rng, seed=seed, length=length, haystack=haystack, icl=icl)

    def attempt(units: int) -> Rendered | None:
        rng.setstate(state)
        try:
            rendered = render(units)
        except TooManyWords:
            return None
        return rendered if tokens.count(rendered.text) <= budget else None

    rendered = attempt(n)
    if rendered is not None:
        return rendered, n
    smallest = int(task.args["num_hops"]) + 1 if task.kind == "variable_tracking" \
        else 1  # type: ignore[call-overload]
    best: tuple[Rendered, int] | None = None
    lower, upper = smallest, n - 1
    while lower <= upper:
        mid = (lower + upper) // 2
        rendered = attempt(mid)
        if rendered is not None:
            best, lower = (rendered, mid), mid + 1
        else:
            upper = mid - 1
    if best is None:
        raise ValueError(f"{task.name}: no sample fits length {length}")
    return best
