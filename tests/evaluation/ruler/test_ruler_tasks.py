"""RULER's synthetic tasks: per task, a prompt rendered for a fixed seed equals RULER's template
(an independent copy in ``ruler_readers``) with its placeholders filled; the needles, haystack
and answers follow RULER's definition; prompt + tokens_to_generate never exceeds the length
and fills it to within one haystack step; a perfect reader scores 100."""

from __future__ import annotations

import json
import random
import re

import pytest

from megatron_endprompt.evaluation.ruler import synthetic as ruler
from megatron_endprompt.evaluation.ruler import sources as ruler_sources
from megatron_endprompt.evaluation.core.prompt import TextTokens
from megatron_endprompt.evaluation.ruler.spec import (DEPTHS, RULER_TASKS, SYNTHETIC_TASKS,
                                                      TEMPLATES)
from megatron_endprompt.evaluation.core.scoring import score
from ruler_readers import (NOISE, RULER_TEXT, cwe_counts, cwe_main, fwe_counts, niah_parts,
                           perfect_answer, vt_main)

LENGTHS = [2048, 4096]
SEED = 7


@pytest.fixture(scope="module")
def haystack():
    return ruler_sources.load_haystack()


@pytest.fixture(scope="module")
def made(hf_tokenizer, haystack):
    """Two samples per RULER task and length, for each tokenizer flavour."""
    tokens = TextTokens(hf_tokenizer)
    return {t: ruler.make_ruler_samples(t, tokens, lengths=LENGTHS, samples=2, seed=SEED,
                                        haystack=haystack) for t in SYNTHETIC_TASKS}


def test_spec_matches_ruler():
    """The carried facts: tokens_to_generate, task table (RULER synthetic.yaml), depths."""
    assert {k: v["tokens_to_generate"] for k, v in TEMPLATES.items()} == {
        "niah": 128, "variable_tracking": 30, "common_words_extraction": 120,
        "freq_words_extraction": 50}
    assert SYNTHETIC_TASKS == ("niah_single_1", "niah_single_2", "niah_single_3",
                               "niah_multikey_1", "niah_multikey_2", "niah_multikey_3",
                               "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe")
    a = RULER_TASKS["niah_multikey_3"].args
    assert (a["type_haystack"], a["type_needle_k"], a["type_needle_v"]) == ("needle", "uuids",
                                                                            "uuids")
    assert RULER_TASKS["niah_single_1"].args["type_haystack"] == "noise"
    assert len(DEPTHS) == 40 and DEPTHS[0] == 0 and DEPTHS[-1] == 100 and DEPTHS[1] == 3
    assert all(t.metric == "string_match_all" for t in RULER_TASKS.values())


def _niah_expected(task: str, prompt: str) -> str:
    a = RULER_TASKS[task].args
    text, tv = RULER_TEXT["niah"], a["type_needle_v"]
    if a["num_needle_q"] * a["num_needle_v"] == 1:
        for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
            text = text.replace(old, new)
        tv = tv[:-1]
    context, query = niah_parts(prompt)
    return text.format(type_needle_v=tv, context=context, query=query)


@pytest.mark.parametrize("task", [t for t in SYNTHETIC_TASKS if t.startswith("niah_")])
def test_niah_prompt_is_ruler_template(made, task):
    a = RULER_TASKS[task].args
    for s in made[task]:
        assert s.prompt == _niah_expected(task, s.prompt)
        context, query = niah_parts(s.prompt)
        needles = re.findall(r"One of the special magic (\w+) for (.+?) is: (\S+)\.", context)
        real = [n for n in needles if n[2] in s.answers]
        assert all(n[0] == a["type_needle_v"] for n in needles)  # plural in the needle
        assert len(s.answers) == a["num_needle_q"] * a["num_needle_v"]
        assert len(re.split(r", and |, ", query)) == a["num_needle_q"]
        assert len(real) == len(s.answers)
        value_re = {"numbers": r"\d{7}", "uuids": r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-"
                    r"[89ab][0-9a-f]{3}-[0-9a-f]{12}", "words": r"[a-z]+-[a-z]+"}
        key_re = value_re[a["type_needle_k"]].replace("[a-z]+-[a-z]+", r".+-.+")
        assert all(re.fullmatch(value_re[a["type_needle_v"]], v) for v in s.answers)
        assert all(re.fullmatch(key_re, n[1]) for n in real), real
        n_needles = a["num_needle_v"] * max(a["num_needle_k"], a["num_needle_q"])
        if a["type_haystack"] == "noise":
            lines = context.split("\n")
            assert set(lines) - {NOISE} == {f"One of the special magic {n[0]} for {n[1]} is: "
                                             f"{n[2]}." for n in needles}
            assert len(lines) == s.extra["haystack_units"] + n_needles
        elif a["type_haystack"] == "needle":
            lines = context.split("\n")
            assert all(re.fullmatch(r"One of the special magic \w+ for .+? is: \S+\.", line)
                       for line in lines)
            assert len(lines) == s.extra["haystack_units"] + n_needles
        else:  # essay: needles between sentences of the haystack text
            # RULER joins an empty first part when a needle is at depth 0: a leading space
            assert context.lstrip(" ").startswith(("First Citizen:", "One of the special"))
        assert 0.0 <= s.depth <= 1.0


def test_vt_prompt_is_ruler_template(made):
    for s in made["vt"]:
        main = vt_main(s.prompt)
        icl = s.prompt[:len(s.prompt) - len(main)]
        assert icl.startswith("Memorize and track the chain(s)") and icl.endswith("\n\n")
        context = main.split("\n\n", 1)[1].rsplit("\nQuestion:", 1)[0]
        value = re.search(r"VAR \w{5} = (\d{5})\n", context + "\n").group(1)
        assert main == RULER_TEXT["vt"].format(context=context, query=value, num_v=5)
        assert set(context.split("\n")) - {NOISE} == {
            f"VAR {s.answers[0]} = {value}",
            *(f"VAR {s.answers[j + 1]} = VAR {s.answers[j]} " for j in range(4))}
        assert len(s.answers) == 5 and all(re.fullmatch(r"[A-Z]{5}", v) for v in s.answers)
        # the in-context example: 3-letter names, answered after the prefix
        assert re.search(r"they are:  [A-Z]{3} [A-Z]{3} [A-Z]{3} [A-Z]{3} [A-Z]{3}\n\n$", icl)


def test_cwe_prompt_is_ruler_template(made):
    for s in made["cwe"]:
        main = cwe_main(s.prompt)
        context = main.split("\n")[1]
        assert main == RULER_TEXT["cwe"].format(context=context)
        shot = s.prompt[:len(s.prompt) - len(main) - 1]
        assert shot.startswith(RULER_TEXT["cwe"].split("{context}")[0])
        counts = cwe_counts(s.prompt)
        common, rare = (30, 3) if s.length >= 4096 else (6, 1)
        # the toy tokenizer fits few words: RULER's answer is the first min(10, n) words
        assert len(s.answers) == min(10, s.extra["haystack_units"])
        assert {counts[w] for w in s.answers} == {common}
        assert set(counts.values()) <= {common, rare} and len(counts) == s.extra[
            "haystack_units"]
        assert [int(i) for i in re.findall(r"(\d+)\. ", context)] == list(
            range(1, sum(counts.values()) + 1))


def test_fwe_prompt_is_ruler_template(made):
    for s in made["fwe"]:
        context = s.prompt.split("coded words. ", 1)[1].split("\nQuestion:", 1)[0]
        assert s.prompt == RULER_TEXT["fwe"].format(context=context)
        counts = fwe_counts(s.prompt)
        ranked = [w for w, _ in counts.most_common()]
        assert ranked[0] == "..." and tuple(ranked[1:4]) == s.answers
        assert all(re.fullmatch(r"[a-z]{6}", w) for w in ranked[1:])


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_length_protocol(made, hf_tokenizer, task):
    """input + tokens_to_generate <= length (the ids the model receives, BOS included); the
    haystack is the largest that fits (one more unit overflows for the fitting draw)."""
    ttg = RULER_TASKS[task].tokens_to_generate
    for s in made[task]:
        ids = hf_tokenizer(s.prompt)["input_ids"]
        assert list(s.input_ids) == ids and ids[0] == hf_tokenizer.bos_token_id
        assert len(ids) + ttg <= s.length
        assert s.max_new_tokens == ttg
    lengths = {s.length: len(s.input_ids) + ttg for s in made[task]}
    assert max(lengths.values()) > 0.5 * max(lengths)  # fills, not a token sample


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_perfect_reader_scores_100(made, task):
    for s in made[task]:
        assert score("string_match_all", perfect_answer(task, s.prompt), s.answers) == 1.0
        assert score("string_match_all", " I do not know.", s.answers) == 0.0


def test_seeded_and_independent(hf_tokenizer, haystack, made):
    """Same seed, same prompt; a prompt does not depend on the other lengths of the run."""
    tokens = TextTokens(hf_tokenizer)
    again = ruler.make_ruler_samples("niah_single_2", tokens, lengths=[4096], samples=2,
                                     seed=SEED, haystack=haystack)
    assert [s.prompt for s in again] == [s.prompt for s in made["niah_single_2"]
                                         if s.length == 4096]
    other = ruler.make_ruler_samples("niah_single_2", tokens, lengths=[4096], samples=1,
                                     seed=SEED + 1, haystack=haystack)
    assert other[0].prompt != again[0].prompt


def test_essay_needle_depths_follow_ruler(hf_tokenizer, haystack):
    """Essay needles go between sentences at RULER's 40 depths: over many samples the first
    needle lands across the whole context."""
    tokens = TextTokens(hf_tokenizer)
    made = ruler.make_ruler_samples("niah_single_2", tokens, lengths=[4096], samples=10,
                                    seed=1, haystack=haystack)
    depths = [s.depth for s in made]
    assert min(depths) < 0.3 and max(depths) > 0.7
    for s in made:
        context, _ = niah_parts(s.prompt)
        before = context.split("One of the special magic")[0]
        assert before == "" or before.endswith((". ", "? ", "! ", " ")), before[-20:]


def test_too_short_length_names_task(hf_tokenizer, haystack):
    with pytest.raises(ValueError, match="fwe|too short"):
        ruler.make_ruler_samples("fwe", TextTokens(hf_tokenizer), lengths=[60], samples=1,
                                 seed=1, haystack=haystack)
    with pytest.raises(ValueError, match="niah_single_1: length 150 is too short"):
        ruler.make_ruler_samples("niah_single_1", TextTokens(hf_tokenizer), lengths=[150],
                                 samples=1, seed=1, haystack=haystack)


def test_haystack_sources(tmp_path):
    h = ruler_sources.load_haystack()
    assert h.substitute and len(h.words) > 40_000 and h.words[:2] == ("First", "Citizen:")
    pg = tmp_path / "PaulGrahamEssays.json"
    pg.write_text('{"text": "' + "An essay sentence here. " * 50 + '"}', encoding="utf-8")
    got = ruler_sources.load_haystack(str(pg))
    assert not got.substitute and got.words[:3] == ("An", "essay", "sentence")
    txt = tmp_path / "mine.txt"
    txt.write_text("word " * 200, encoding="utf-8")
    assert ruler_sources.load_haystack(str(txt)).substitute
    from megatron_endprompt.errors import UserError
    with pytest.raises(UserError, match="--haystack .*no such file"):
        ruler_sources.load_haystack(str(tmp_path / "none.txt"))
    bad = tmp_path / "bad.json"
    bad.write_text("[1]", encoding="utf-8")
    with pytest.raises(UserError, match="field 'text'"):
        ruler_sources.load_haystack(str(bad))
    rng = random.Random(0)
    assert re.fullmatch(r"[1-9]\d{6}", ruler_sources.random_value(rng, "numbers"))
    assert re.fullmatch(r"[0-9a-f-]{36}", ruler_sources.random_value(rng, "uuids"))
    adj, noun = ruler_sources.random_value(rng, "words").split("-", 1)
    words = ruler_sources.wonder_words()
    assert adj in words["adjs"] and noun in words["nouns"]


def test_haystack_content_identity_is_recorded(tmp_path):
    """A haystack is identified by its content as well as its name: its characters and the
    SHA-256 of its text go into the results, so a file that is only *named*
    PaulGrahamEssays.json can be told from RULER's own by anyone holding that file."""
    import hashlib

    text = "An essay sentence here. " * 50
    pg = tmp_path / "PaulGrahamEssays.json"
    pg.write_text(json.dumps({"text": text}), encoding="utf-8")
    got = ruler_sources.load_haystack(str(pg))
    assert got.chars == len(text)
    assert got.sha256 == hashlib.sha256(text.encode("utf-8")).hexdigest()
    other = tmp_path / "other" / "PaulGrahamEssays.json"
    other.parent.mkdir()
    other.write_text(json.dumps({"text": text.replace("essay", "story")}), encoding="utf-8")
    assert ruler_sources.load_haystack(str(other)).sha256 != got.sha256
    assert ruler_sources.load_haystack().sha256  # the shipped substitute too
