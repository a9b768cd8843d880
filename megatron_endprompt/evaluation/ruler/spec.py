"""RULER's synthetic task definitions, carried over as facts from NVIDIA/RULER.

Every string and number here is copied from RULER (commit c3f5e3b of github.com/NVIDIA/RULER);
each block names the file it comes from. The generators in ``ruler_niah`` and
``ruler_aggregate`` and the length protocol in ``ruler`` are our own code that follows these
definitions. Nothing else in the package may change a template: a unit test per task compares
rendered prompts with these strings.

Prompt of a task = ``template`` with the model template ``"base"`` (``"{task_template}"``, RULER
``scripts/data/template.py``: no chat template, as for base models) followed by
``answer_prefix`` (RULER ``scripts/data/prepare.py``: ``config['template'] =
model_template.format(task_template=task_template) + answer_prefix``). The model continues the
prompt with at most ``tokens_to_generate`` tokens (greedy: ``TEMPERATURE="0.0"`` in RULER
``scripts/config_models.sh``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TEMPLATES", "RULER_TASKS", "RulerTask", "NIAH_NEEDLE", "NOISE_HAYSTACK", "DEPTHS",
           "SYNTHETIC_TASKS", "ESSAY_TASKS", "ruler_template"]

# RULER scripts/data/synthetic/constants.py, TASKS: tokens_to_generate, template, answer_prefix.
TEMPLATES: dict[str, dict[str, object]] = {
    "niah": {
        "tokens_to_generate": 128,
        "template": "Some special magic {type_needle_v} are hidden within the following text. "
                    "Make sure to memorize it. I will quiz you about the {type_needle_v} "
                    "afterwards.\n{context}\nWhat are all the special magic {type_needle_v} "
                    "for {query} mentioned in the provided text?",
        "answer_prefix": " The special magic {type_needle_v} for {query} mentioned in the "
                         "provided text are",
    },
    "variable_tracking": {
        "tokens_to_generate": 30,
        "template": "Memorize and track the chain(s) of variable assignment hidden in the "
                    "following text.\n\n{context}\nQuestion: Find all variables that are "
                    "assigned the value {query} in the text above.",
        "answer_prefix": " Answer: According to the chain(s) of variable assignment in the text "
                         "above, {num_v} variables are assigned the value {query}, they are: ",
    },
    "common_words_extraction": {
        "tokens_to_generate": 120,
        "template": "Below is a numbered list of words. In these words, some appear more often "
                    "than others. Memorize the ones that appear most often.\n{context}\n"
                    "Question: What are the 10 most common words in the above list?",
        "answer_prefix": " Answer: The top 10 words that appear most often in the list are:",
    },
    "freq_words_extraction": {
        "tokens_to_generate": 50,
        "template": "Read the following coded text and track the frequency of each coded word. "
                    "Find the three most frequently appeared coded words. {context}\nQuestion: "
                    "Do not provide any explanation. Please ignore the dots '....'. What are "
                    "the three most frequently appeared words in the above coded text?",
        "answer_prefix": " Answer: According to the coded text above, the three most frequently "
                         "appeared words are:",
    },
}

# RULER scripts/data/synthetic/niah.py: the needle and the "noise" haystack (the latter also in
# variable_tracking.py).
NIAH_NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NOISE_HAYSTACK = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There "
                  "and back again.")
# RULER niah.py / variable_tracking.py: insertion depths (percent) for essay haystacks.
DEPTHS: list[int] = [int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True))]


@dataclass(kw_only=True, frozen=True)
class RulerTask:
    """One task of RULER ``scripts/synthetic.yaml``: its generator (``kind``, a key of
    :data:`TEMPLATES`), the generator arguments and the metric of RULER
    ``scripts/eval/synthetic/constants.py`` (``string_match_all`` for every synthetic task)."""

    name: str
    kind: str
    args: dict[str, object]
    metric: str = "string_match_all"

    @property
    def tokens_to_generate(self) -> int:
        """RULER's generation budget of the task's kind."""
        return int(TEMPLATES[self.kind]["tokens_to_generate"])  # type: ignore[arg-type]

    @property
    def haystack(self) -> str | None:
        """``essay``, ``noise``, ``needle`` or ``None`` (cwe and fwe have no haystack)."""
        return self.args.get("type_haystack")  # type: ignore[return-value]


def _niah(name: str, hay: str, k: str, v: str, nk: int, nv: int, nq: int) -> RulerTask:
    return RulerTask(name=name, kind="niah", args={
        "type_haystack": hay, "type_needle_k": k, "type_needle_v": v,
        "num_needle_k": nk, "num_needle_v": nv, "num_needle_q": nq})


# RULER scripts/synthetic.yaml (qa_1 / qa_2 read local SQuAD / HotpotQA files: ``ruler_qa``).
RULER_TASKS: dict[str, RulerTask] = {t.name: t for t in (
    _niah("niah_single_1", "noise", "words", "numbers", 1, 1, 1),
    _niah("niah_single_2", "essay", "words", "numbers", 1, 1, 1),
    _niah("niah_single_3", "essay", "words", "uuids", 1, 1, 1),
    _niah("niah_multikey_1", "essay", "words", "numbers", 4, 1, 1),
    _niah("niah_multikey_2", "needle", "words", "numbers", 1, 1, 1),
    _niah("niah_multikey_3", "needle", "uuids", "uuids", 1, 1, 1),
    _niah("niah_multivalue", "essay", "words", "numbers", 1, 4, 1),
    _niah("niah_multiquery", "essay", "words", "numbers", 1, 1, 4),
    RulerTask(name="vt", kind="variable_tracking",
              args={"type_haystack": "noise", "num_chains": 1, "num_hops": 4}),
    RulerTask(name="cwe", kind="common_words_extraction",
              args={"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}),
    RulerTask(name="fwe", kind="freq_words_extraction", args={"alpha": 2.0}),
)}
#: Every task we implement, in RULER's order (scripts/config_tasks.sh, less qa_1 and qa_2).
SYNTHETIC_TASKS: tuple[str, ...] = tuple(RULER_TASKS)
#: Tasks whose haystack is RULER's Paul Graham essays (a substitute text unless given).
ESSAY_TASKS: tuple[str, ...] = tuple(n for n, t in RULER_TASKS.items() if t.haystack == "essay")


def ruler_template(kind: str) -> str:
    """``template + answer_prefix`` under RULER's ``base`` model template."""
    spec = TEMPLATES[kind]
    return "{task_template}".format(task_template=spec["template"]) + str(spec["answer_prefix"])
