"""RULER's retrieval and multi-hop tracing prompts: the eight ``niah_*`` tasks and ``vt``.

Our code, following RULER ``scripts/data/synthetic/niah.py`` (``generate_input_output``) and
``variable_tracking.py`` (``generate_chains``, ``generate_input_output``, ``randomize_icl``)
step by step, including their quirks (noted where they matter): the needle order is shuffled
with a generator seeded by the run seed alone; the singular rewrite of the NIAH template is a
plain string replacement on the whole template.

A generator renders the prompt text for a haystack of ``n`` units (essay words, noise
sentences or distractor needles); ``ruler.fit_haystack`` finds the ``n`` that fits the length.
Randomness comes from the per-sample ``random.Random`` passed in (RULER uses the global
``random``/``numpy.random`` seeded once per run).
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from megatron_endprompt.evaluation.ruler.sources import (Haystack, random_value,
                                                         split_sentences)
from megatron_endprompt.evaluation.ruler.spec import (DEPTHS, NIAH_NEEDLE, NOISE_HAYSTACK,
                                                      RulerTask, ruler_template)

__all__ = ["Rendered", "render_niah", "render_vt", "vt_icl_example"]


@dataclass(kw_only=True, frozen=True)
class Rendered:
    """A prompt (template + answer prefix, placeholders filled), its reference answers and the
    depth (0..1, by characters of the context) of the first answer's needle, ``None`` where a
    task has no needle."""

    text: str
    answers: tuple[str, ...]
    depth: float | None = None


def _depth(context: str, needle: str) -> float | None:
    at = context.find(needle)
    return None if at < 0 or not context else round(at / len(context), 4)


def niah_template(task: RulerTask) -> tuple[str, str]:
    """The NIAH template (with answer prefix) and ``type_needle_v`` as RULER fills them: for one
    query and one value RULER rewrites the template to the singular (niah.py: ``Some``->``A``,
    ``are all``->``is``, ``are``->``is``, ``answers``->``answer`` and drops the ``s`` of the
    value type)."""
    a = task.args
    template = ruler_template("niah")
    type_v = str(a["type_needle_v"])
    if int(a["num_needle_q"]) * int(a["num_needle_v"]) == 1:  # type: ignore[call-overload]
        for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"),
                         ("answers", "answer")):
            template = template.replace(old, new)
        type_v = type_v[:-1]
    return template, type_v


def render_niah(task: RulerTask, n: int, rng: random.Random, *, seed: int,
                haystack: Haystack | None) -> Rendered:
    """One NIAH prompt with a haystack of ``n`` units."""
    a = task.args
    kind_k, kind_v, hay = str(a["type_needle_k"]), str(a["type_needle_v"]), a["type_haystack"]
    n_q = int(a["num_needle_q"])  # type: ignore[call-overload]
    n_k = max(int(a["num_needle_k"]), n_q)  # type: ignore[call-overload]
    keys: list[str] = []
    values: list[list[str]] = []
    needles: list[str] = []
    for _ in range(n_k):
        keys.append(random_value(rng, kind_k))
        vals = []
        for _ in range(int(a["num_needle_v"])):  # type: ignore[call-overload]
            vals.append(random_value(rng, kind_v))
            needles.append(NIAH_NEEDLE.format(type_needle_v=kind_v, key=keys[-1],
                                              value=vals[-1]))
        values.append(vals)
    random.Random(seed).shuffle(needles)  # RULER: Random(args.random_seed), not the sample rng

    if hay == "essay":
        assert haystack is not None, "essay tasks need a haystack"
        words = haystack.words
        reps = -(-n // len(words))
        sents = split_sentences(" ".join((words * reps)[:n]))
        cuts = sorted(int(len(sents) * (d / 100)) for d in rng.sample(DEPTHS, len(needles)))
        bounds = [0, *cuts, len(sents)]
        parts: list[str] = []
        for i in range(1, len(bounds)):
            parts.append(" ".join(sents[bounds[i - 1]:bounds[i]]))
            if i - 1 < len(needles):
                parts.append(needles[i - 1])
        context = " ".join(parts)
    else:
        if hay == "noise":
            sentences = [NOISE_HAYSTACK] * n
        elif hay == "needle":
            sentences = [NIAH_NEEDLE.format(type_needle_v=kind_v, key=random_value(rng, kind_k),
                                            value=random_value(rng, kind_v)) for _ in range(n)]
        else:
            raise ValueError(f"unknown haystack {hay!r}")
        for index, needle in zip(sorted(rng.sample(range(n), len(needles)), reverse=True),
                                 needles):
            sentences.insert(index, needle)
        context = "\n".join(sentences)

    picked = rng.sample(range(n_k), n_q)
    queries = [keys[i] for i in picked]
    answers = tuple(v for i in picked for v in values[i])
    query = (", ".join(queries[:-1]) + ", and " + queries[-1]) if len(queries) > 1 \
        else queries[0]
    template, type_v = niah_template(task)
    text = template.format(type_needle_v=type_v, context=context, query=query)
    first = next(nd for nd in needles if nd.endswith(f" {answers[0]}."))
    return Rendered(text=text, answers=answers, depth=_depth(context, first))


def _chains(rng: random.Random, n_chains: int, n_hops: int,
            icl: bool) -> tuple[list[list[str]], list[list[str]]]:
    """RULER ``generate_chains``: variable names (5 capitals, 3 in the ICL example) and the
    chains ``VAR A = 12345``, ``VAR B = VAR A `` (trailing space as RULER)."""
    k = 3 if icl else 5
    hops = min(10, n_hops) if icl else n_hops
    names = ["".join(rng.choices(string.ascii_uppercase, k=k)) for _ in range((hops + 1)
                                                                                * n_chains)]
    while len(set(names)) < n_chains * (hops + 1):
        names.append("".join(rng.choices(string.ascii_uppercase, k=k)))
    out_vars, out_chains = [], []
    for i in range(0, len(names), hops + 1):
        v = names[i:i + hops + 1]
        out_vars.append(v)
        # RULER: str(np.random.randint(10000, 99999)) (upper bound exclusive)
        chain = [f"VAR {v[0]} = {12345 if icl else rng.randint(10000, 99998)}"]
        chain += [f"VAR {v[j + 1]} = VAR {v[j]} " for j in range(hops)]
        out_chains.append(chain)
    return out_vars, out_chains


def render_vt(task: RulerTask, n: int, rng: random.Random, *, icl: bool = False,
              icl_example: str | None = None) -> Rendered:
    """One ``vt`` prompt with ``n`` noise sentences. ``icl=True`` renders RULER's in-context
    example (3-letter names, value 12345); ``icl_example`` (its text plus answer) is then
    randomized and put before the prompt, as RULER does for every test prompt."""
    a = task.args
    hops, n_chains = int(a["num_hops"]), int(a["num_chains"])  # type: ignore[call-overload]
    if a["type_haystack"] != "noise":
        raise ValueError("vt is defined on the noise haystack in RULER's synthetic.yaml")
    names, chains = _chains(rng, n_chains, hops, icl)
    value = chains[0][0].split("=")[-1].strip()
    sentences = [NOISE_HAYSTACK] * n
    for chain in chains:
        positions = sorted(rng.sample(range(len(sentences)), len(chain)))
        for j, pos in enumerate(positions):
            sentences.insert(pos + j, chain[j])
    context = "\n".join(sentences).replace(". \n", ".\n")
    text = ruler_template("variable_tracking").format(context=context, query=value,
                                                      num_v=hops + 1)
    if icl_example is not None:
        # RULER inserts the example before the task template (at 0 under the base template)
        text = _randomize_icl(icl_example, rng, hops) + "\n" + text
    return Rendered(text=text, answers=tuple(names[0]),
                    depth=_depth(context, chains[0][0]))


def vt_icl_example(rendered: Rendered) -> str:
    """RULER's ICL example text: its prompt, a space, the answer names and a newline."""
    return rendered.text + " " + " ".join(rendered.answers) + "\n"


def _randomize_icl(example: str, rng: random.Random, hops: int) -> str:
    """RULER ``randomize_icl``: new random names for the example's answer names (replaced
    everywhere in the example) and a new 5-digit value for 12345."""
    for item in example.strip().split()[-hops - 1:]:
        example = example.replace(item, "".join(rng.choices(string.ascii_uppercase,
                                                            k=len(item))))
    return example.replace("12345", str(rng.randint(10000, 99998)))
