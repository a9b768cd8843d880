"""Task generators: exact token length, needles really at the requested depth, answers
recoverable by a perfect reader, determinism under a seed (both tokenizer flavours)."""

from __future__ import annotations

import re
import time

import pytest

from megatron_endprompt.evaluation.passkey import legacy as tasks
from megatron_endprompt.evaluation.core.scoring import score

LENGTHS = [700, 1500]
DEPTHS = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]


def perfect_answer(text: str) -> str:
    """The continuation a reader with perfect recall writes after the answer prefix, from the
    prompt text alone: it parses the needles and the question."""
    text = text.rstrip()
    if text.endswith("What is the pass key? The pass key is"):
        keys = re.findall(r"The pass key is (\d+)\. Remember it\. \1 is the pass key\.", text)
        assert len(keys) == 1, text
        return f" {keys[0]}."
    needles = re.findall(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d+)\.", text)
    m = re.search(r"What are all the special magic numbers for (.+?) mentioned in the provided "
                  r"text\? The special magic numbers for \1 mentioned in the provided text are$",
                  text)
    assert m, text[-300:]
    queried = re.split(r", and |, ", m.group(1))
    values = [v for q in queried for k, v in needles if k == q]
    return " " + ", ".join(values) + "."


def perfect_reader(sample: tasks.Sample, tokenizer) -> str:
    """:func:`perfect_answer` of a sample's decoded prompt."""
    return perfect_answer(tokenizer.decode(list(sample.input_ids), skip_special_tokens=True))


@pytest.fixture(scope="module")
def generated(hf_tokenizer):
    """Every retrieval task at LENGTHS x DEPTHS, 2 samples each."""
    toks = tasks.PromptTokens(hf_tokenizer)
    fillers: dict = {}
    out = {t: tasks.make_samples(t, toks, lengths=LENGTHS, depths=DEPTHS, samples=2, seed=7,
                                 fillers=fillers)
           for t in tasks.RETRIEVAL_TASKS}
    return toks, fillers, out


@pytest.mark.parametrize("task", tasks.RETRIEVAL_TASKS)
def test_exact_length_and_layout(generated, hf_tokenizer, task):
    toks, _, out = generated
    samples = out[task]
    assert len(samples) == len(LENGTHS) * len(DEPTHS) * 2
    for s in samples:
        assert len(s.input_ids) == s.length
        if toks.bos:
            assert s.input_ids[0] == toks.bos[0]
        # every needle's ids sit where the sample says, inside the haystack span
        start, end = s.haystack
        for pos, ids in zip(s.needle_starts, s.needle_ids, strict=True):
            assert start <= pos and pos + len(ids) <= end
            assert s.input_ids[pos:pos + len(ids)] == ids
        text = hf_tokenizer.decode(list(s.input_ids), skip_special_tokens=True)
        intro = tasks.PASSKEY_INTRO if task == "passkey" else tasks.NIAH_INTRO
        assert text.lstrip().startswith(intro)


@pytest.mark.parametrize("task", tasks.RETRIEVAL_TASKS)
def test_needle_at_requested_depth(generated, task):
    """Haystack tokens before each needle / haystack tokens == the recorded depth, within one
    filler sentence of the requested one; the queried needle goes at the requested depth."""
    _, fillers, out = generated
    kind = "repeat" if task == "passkey" else "essay"
    max_sentence = fillers[kind].max_sentence
    for s in out[task]:
        start, end = s.haystack
        budget = (end - start) - sum(len(n) for n in s.needle_ids)
        targets = tasks.needle_targets(task, s.depth)
        assert targets[0] == s.depth
        for j, pos in enumerate(s.needle_starts):
            before = sum(len(s.needle_ids[i]) for i, p in enumerate(s.needle_starts)
                         if p < pos)
            achieved = (pos - start - before) / budget
            assert achieved == pytest.approx(s.needle_depths[j])
            assert abs(achieved - targets[j]) <= max_sentence / budget, (task, s.depth, j)
        if s.depth == 1.0:  # the queried needle ends right before the question
            assert s.needle_starts[0] + len(s.needle_ids[0]) == end
        # overall position in the prompt: within a sentence of depth * haystack
        want = start + s.depth * budget
        assert abs(s.needle_starts[0] - want) <= max_sentence + sum(map(len, s.needle_ids))


@pytest.mark.parametrize("task", tasks.RETRIEVAL_TASKS)
def test_perfect_reader_scores_one(generated, hf_tokenizer, task):
    _, _, out = generated
    for s in out[task]:
        assert score(s.metric, perfect_reader(s, hf_tokenizer), s.answers) == 1.0


def test_multi_needle_variants(generated, hf_tokenizer):
    _, _, out = generated
    for task, (n_keys, n_values, n_query) in tasks.NIAH_TASKS.items():
        for s in out[task]:
            text = hf_tokenizer.decode(list(s.input_ids), skip_special_tokens=True)
            found = re.findall(r"special magic numbers for ([a-z]+-[a-z]+) is: (\d+)\.", text)
            assert len(found) == n_keys * n_values
            assert len({k for k, _ in found}) == n_keys
            assert len(s.answers) == n_values * n_query
            assert len(set(s.answers)) == len(s.answers)


def test_needles_are_whole_sentences(generated, hf_tokenizer):
    """Needles go at sentence boundaries: the text right before a needle ends a sentence and
    the text after it starts one (or is the question)."""
    _, _, out = generated
    for s in out["niah_multikey"] + out["passkey"]:
        for pos, ids in zip(s.needle_starts, s.needle_ids, strict=True):
            before = hf_tokenizer.decode(list(s.input_ids[s.haystack[0]:pos]))
            after = hf_tokenizer.decode(list(s.input_ids[pos + len(ids):s.haystack[1] + 3]))
            if pos > s.haystack[0] and before.strip():
                assert before.rstrip().endswith("."), before[-40:]
            assert after == "" or after.lstrip()[:1].isupper(), after[:40]


def test_determinism_and_seed(hf_tokenizer):
    toks = tasks.PromptTokens(hf_tokenizer)
    kw = dict(depths=[0.0, 0.5], samples=2)
    for task in tasks.RETRIEVAL_TASKS:
        a = tasks.make_samples(task, toks, lengths=[800], seed=3, **kw)
        b = tasks.make_samples(task, tasks.PromptTokens(hf_tokenizer), lengths=[800], seed=3,
                               **kw)
        c = tasks.make_samples(task, toks, lengths=[800], seed=4, **kw)
        d = tasks.make_samples(task, toks, lengths=[600, 800], seed=3, **kw)
        assert a == b
        assert [s.input_ids for s in a] != [s.input_ids for s in c]
        assert [s.answers for s in a] != [s.answers for s in c]
        assert d[len(a):] == a  # adding a length leaves the other prompts unchanged


def test_too_short_and_unknown(hf_tokenizer):
    toks = tasks.PromptTokens(hf_tokenizer)
    for task in tasks.RETRIEVAL_TASKS:
        overhead = tasks.prompt_overhead(task, toks)
        with pytest.raises(ValueError, match="no room for a haystack"):
            tasks.make_samples(task, toks, lengths=[overhead // 2], depths=[0.5], samples=1,
                               seed=0)
        # the estimate is an upper bound: one more token always leaves a haystack
        made = tasks.make_samples(task, toks, lengths=[overhead + 1], depths=[0, 0.5, 1],
                                  samples=4, seed=0)
        assert all(len(s.input_ids) == overhead + 1 for s in made)
        assert all(s.haystack[1] - s.haystack[0] > sum(map(len, s.needle_ids)) for s in made)
    with pytest.raises(ValueError, match="unknown task"):
        tasks.make_samples("bogus", toks, lengths=[900], depths=[0.5], samples=1, seed=0)


def test_long_prompt_is_linear_time(hf_tokenizer):
    """A 128K-token prompt is built from cached pieces in well under a second or two."""
    toks = tasks.PromptTokens(hf_tokenizer)
    fillers: dict = {}
    tasks.make_samples("niah_single", toks, lengths=[2000], depths=[0.5], samples=1, seed=0,
                       fillers=fillers)  # tokenize the filler pool once
    t0 = time.perf_counter()
    (s,) = tasks.make_samples("niah_multivalue", toks, lengths=[131072], depths=[0.3],
                              samples=1, seed=0, fillers=fillers)
    assert time.perf_counter() - t0 < 5.0
    assert len(s.input_ids) == 131072
