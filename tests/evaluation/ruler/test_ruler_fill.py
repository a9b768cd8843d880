"""RULER prompts fill the length they are reported at: for every synthetic task and length,
prompt + ``tokens_to_generate`` is at most the length and at least 95% of it (RULER's own
generator reaches that; a ``vt`` bound estimated on a render with its ~500-token in-context
example stopped the search at 70-92%). Token counting only, no model.

The tokenizer is a byte-level BPE of 2,000 pieces trained on RULER's own texts (templates, noise
sentence, needles, haystack, word lists), so a word takes about as many tokens as under a real
Llama tokenizer; the 400-piece test tokenizer spells RULER's noise sentence in 55 tokens, and at
1K the ``vt`` example alone would not fit."""

from __future__ import annotations

import random
import string

import pytest

from megatron_endprompt.evaluation.ruler import synthetic as ruler
from megatron_endprompt.evaluation.ruler import sources as ruler_sources
from megatron_endprompt.evaluation.core.prompt import TextTokens
from megatron_endprompt.evaluation.ruler.spec import (NIAH_NEEDLE, NOISE_HAYSTACK, SYNTHETIC_TASKS,
                                                      TEMPLATES)
from tests.evaluation.tiny_tokenizers import build_tokenizer

LENGTHS = [1024, 2048, 3072, 8192, 16384]


@pytest.fixture(scope="module")
def haystack():
    return ruler_sources.load_haystack()


@pytest.fixture(scope="module")
def ruler_tokens(haystack):
    rng = random.Random(0)
    words = ruler_sources.wonder_words()
    text = [str(v) for spec in TEMPLATES.values() for v in spec.values() if isinstance(v, str)]
    text += [NOISE_HAYSTACK] * 20
    text += [NIAH_NEEDLE.format(type_needle_v="numbers", key=rng.choice(words["adjs"]),
                                value=rng.randint(10**6, 10**7)) for _ in range(200)]
    text += ["VAR " + "".join(rng.choices(string.ascii_uppercase, k=5)) + " = "
             + str(rng.randint(10000, 99999)) for _ in range(200)]
    text += [" ".join(haystack.words[i:i + 200]) for i in range(0, 20000, 200)]
    text += [" ".join(f"{i + 1}. {w}" for i, w in enumerate(words["nouns"][:2000]))]
    return TextTokens(build_tokenizer("bytelevel", extra_text=tuple(text), vocab_size=2000))


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_prompt_fills_its_length(ruler_tokens, haystack, task):
    samples = ruler.make_ruler_samples(task, ruler_tokens, lengths=LENGTHS, samples=2, seed=7,
                                       haystack=haystack)
    fill = {(s.length, s.index): (len(s.input_ids) + s.max_new_tokens) / s.length
            for s in samples}
    assert max(fill.values()) <= 1.0
    low = {k: round(v, 3) for k, v in fill.items() if v < 0.95}
    assert not low, f"{task}: prompt + tokens_to_generate below 95% of the length: {low}"
