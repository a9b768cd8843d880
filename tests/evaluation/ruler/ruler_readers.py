"""Test helpers: RULER's templates as RULER writes them (an independent copy of
``scripts/data/synthetic/constants.py`` in NVIDIA/RULER, so a drifted template in the package
fails the tests), and a perfect reader per task that answers from the prompt text alone."""

from __future__ import annotations

import re
from collections import Counter

# NVIDIA/RULER scripts/data/synthetic/constants.py: template + answer_prefix ("base" template).
RULER_TEXT = {
    "niah": "Some special magic {type_needle_v} are hidden within the following text. Make sure "
            "to memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
            "What are all the special magic {type_needle_v} for {query} mentioned in the "
            "provided text? The special magic {type_needle_v} for {query} mentioned in the "
            "provided text are",
    "vt": "Memorize and track the chain(s) of variable assignment hidden in the following "
          "text.\n\n{context}\nQuestion: Find all variables that are assigned the value {query} "
          "in the text above. Answer: According to the chain(s) of variable assignment in the "
          "text above, {num_v} variables are assigned the value {query}, they are: ",
    "cwe": "Below is a numbered list of words. In these words, some appear more often than "
           "others. Memorize the ones that appear most often.\n{context}\nQuestion: What are the "
           "10 most common words in the above list? Answer: The top 10 words that appear most "
           "often in the list are:",
    "fwe": "Read the following coded text and track the frequency of each coded word. Find the "
           "three most frequently appeared coded words. {context}\nQuestion: Do not provide any "
           "explanation. Please ignore the dots '....'. What are the three most frequently "
           "appeared words in the above coded text? Answer: According to the coded text above, "
           "the three most frequently appeared words are:",
}
NOISE = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
         "again.")
_NEEDLE = re.compile(r"One of the special magic (numbers|words|uuids) for (.+?) is: (\S+)\.")


def niah_parts(prompt: str) -> tuple[str, str]:
    """``(context, query)`` of a NIAH prompt."""
    head, rest = prompt.split("\n", 1)
    context, question = rest.rsplit("\nWhat ", 1)
    query = re.search(r" for (.+) mentioned in the provided text\?", question).group(1)
    return context, query


def read_niah(prompt: str) -> str:
    context, query = niah_parts(prompt)
    keys = re.split(r", and |, ", query)
    found = {}
    for _, key, value in _NEEDLE.findall(context):
        found.setdefault(key, []).append(value)
    # distractor needles (multikey_2/3) share no key with the queried ones in practice
    return " " + ", ".join(v for k in keys for v in found.get(k, [])) + "."


def vt_main(prompt: str) -> str:
    return prompt[prompt.rindex("Memorize and track the chain(s)"):]


def read_vt(prompt: str) -> str:
    main = vt_main(prompt)
    value = re.search(r"assigned the value (\d+) in the text above", main).group(1)
    assign = dict(re.findall(r"VAR (\w+) = (?:VAR )?(\w+)", main))
    names, frontier = [], {value}
    while True:
        nxt = [n for n, src in assign.items() if src in frontier and n not in names]
        if not nxt:
            break
        names += nxt
        frontier = set(nxt)
    return " " + " ".join(names)


def cwe_main(prompt: str) -> str:
    return prompt[prompt.rindex("Below is a numbered list of words."):]


def cwe_counts(prompt: str) -> Counter:
    context = cwe_main(prompt).split("\n")[1]
    return Counter(re.findall(r"\d+\. (\S+)", context))


def read_cwe(prompt: str) -> str:
    top = [w for w, _ in cwe_counts(prompt).most_common(10)]
    return " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(top))


def fwe_counts(prompt: str) -> Counter:
    context = prompt.split("coded words. ", 1)[1].split("\nQuestion:", 1)[0]
    return Counter(context.split(" "))


def read_fwe(prompt: str) -> str:
    top = [w for w, _ in fwe_counts(prompt).most_common(4) if w != "..."][:3]
    return " " + " ".join(top)


def read_passkey(prompt: str) -> str:
    return " " + re.search(r"The pass key is (\d+)\.", prompt).group(1) + "."


def perfect_answer(task: str, prompt: str) -> str:
    """What a perfect model would generate for ``prompt`` of ``task``."""
    if task.startswith("niah_"):
        return read_niah(prompt)
    return {"vt": read_vt, "cwe": read_cwe, "fwe": read_fwe,
            "passkey": read_passkey}[task](prompt)
