"""Passkey retrieval as in landmark attention (Mohtashami & Jaggi 2023, ``llama/run_test.py``
``generate_prompt``), the prompt PoSE and LongLoRA reuse.

The prompt is five lines joined by ``"\\n"``: the task description, ``n_prefix`` characters of
the repeated garbage, the pass-key line **on its own line**, ``n_garbage - n_prefix``
characters of garbage, and the question. The key is ``randint(1, 50000)``; the needle depth is
``n_prefix = int(n_garbage * depth)`` (LongLoRA's depth sweep). Landmark attention sizes the
garbage by characters (LongLoRA: ``int(3.75 * tokens // 1024 * 1024)``); we binary-search the
character count so that ``tokens(prompt) + max_new_tokens <= length`` under the evaluated
tokenizer. Scored as landmark attention does: the first integer of the output equals the key.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from megatron_endprompt.evaluation.core.prompt import PromptSample, TextTokens

__all__ = ["TASK_DESCRIPTION", "GARBAGE", "FINAL_QUESTION", "passkey_line", "passkey_prompt",
           "make_passkey_samples", "MAX_NEW_TOKENS"]

# landmark-attention llama/run_test.py generate_prompt (also LongLoRA passkey_retrieval.py).
TASK_DESCRIPTION = ("There is an important info hidden inside a lot of irrelevant text. Find it "
                    "and memorize them. I will quiz you about the important information there.")
GARBAGE = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
           "again.")
FINAL_QUESTION = "What is the pass key? The pass key is"
#: Generation budget: a key of up to 5 digits and its punctuation fit in far fewer tokens.
MAX_NEW_TOKENS = 10


def passkey_line(key: int) -> str:
    """landmark-attention ``information_line``."""
    return f"The pass key is {key}. Remember it. {key} is the pass key."


def _garbage(n: int) -> str:
    reps = n // (len(GARBAGE) + 1) + 1
    return " ".join([GARBAGE] * reps)[:n]


def passkey_prompt(key: int, n_garbage: int, depth: float) -> str:
    """The five-line prompt with ``n_garbage`` garbage characters, the key line after
    ``int(n_garbage * depth)`` of them."""
    prefix = int(n_garbage * depth)
    return "\n".join([TASK_DESCRIPTION, _garbage(prefix), passkey_line(key),
                      _garbage(n_garbage - prefix), FINAL_QUESTION])


def largest_fitting(fits: Callable[[int], bool], hi: int) -> int | None:
    """The largest ``n`` in ``[0, hi]`` with ``fits(n)`` (``fits`` true up to some ``n``, then
    false: a token budget), by bisection; ``None`` if not even ``fits(0)``."""
    lo, best = 0, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def make_passkey_samples(tokens: TextTokens, *, lengths: list[int], depths: list[float],
                         samples: int, seed: int) -> list[PromptSample]:
    """``samples`` prompts per (length, depth), length-major. Each draws its key from
    ``random.Random("seed:passkey:length:depth:index")``."""
    out: list[PromptSample] = []
    for length in lengths:
        budget = length - MAX_NEW_TOKENS
        # the widest key at the middle depth sizes the garbage; a sample that still does not
        # fit (tokenization differs at the cut points) loses characters until it does
        n = largest_fitting(lambda c: tokens.count(passkey_prompt(50000, c, 0.5)) <= budget,
                     hi=8 * length)
        if n is None:
            raise ValueError(f"passkey: length {length} is too short for the prompt without "
                             f"garbage and {MAX_NEW_TOKENS} generated tokens; use a longer "
                             "length")
        for depth in depths:
            for index in range(samples):
                rng = random.Random(f"{seed}:passkey:{length}:{depth}:{index}")
                key = rng.randint(1, 50000)
                c = n
                while tokens.count(passkey_prompt(key, c, depth)) > budget:
                    c -= 8
                text = passkey_prompt(key, c, depth)
                out.append(PromptSample(task="passkey", length=length, index=index,
                                        input_ids=tokens.array(text), answers=(str(key),),
                                        metric="passkey_exact", max_new_tokens=MAX_NEW_TOKENS,
                                        prompt=text, depth=depth,
                                        extra={"garbage_chars": c}))
    return out
