"""Where RULER's random material comes from: word lists, random values and the essay haystack.

RULER (``scripts/data/synthetic/niah.py``, ``common_words_extraction.py``) draws NIAH keys as
``adjective-noun`` and the common-words lists from the ``wonderwords`` package's
``adjectivelist.txt``, ``nounlist.txt`` and ``verblist.txt``; we read the same files from the
installed ``wonderwords`` (a dependency) rather than shipping a copy.

Essay haystack: RULER joins Paul Graham's essays (``json/PaulGrahamEssays.json``, field
``text``), which must be downloaded. Without ``--haystack`` we use a public-domain substitute
shipped with the package, ``assets/haystack_shakespeare.txt.gz`` (the first 262 KB, 47K words,
of the collected works of Shakespeare as in the "tiny Shakespeare" text); results on it are
labelled ``substitute haystack``. ``--haystack PaulGrahamEssays.json`` (RULER's own file) or any
``.txt``/``.json`` text replaces it.

RULER splits the essay into sentences with NLTK's punkt model (a download); we split at
``.``/``!``/``?`` followed by white space, which places needles at the same kind of boundary.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import re
import uuid
from dataclasses import dataclass
from functools import lru_cache

from megatron_endprompt.errors import UserError

__all__ = ["Haystack", "load_haystack", "BUILTIN_HAYSTACK", "wonder_words", "random_value",
           "split_sentences"]

#: the package's ``evaluation/assets/`` (setup.py ships it as package data)
_ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")
BUILTIN_HAYSTACK = os.path.join(_ASSETS, "haystack_shakespeare.txt.gz")
_SENT_END = re.compile(r"(?<=[.!?])\s+")


@lru_cache(maxsize=1)
def wonder_words() -> dict[str, list[str]]:
    """``nouns``, ``adjs`` and ``verbs`` of wonderwords, as RULER reads them
    (``wonderwords.random_word._get_words_from_text_file``)."""
    try:
        from wonderwords import random_word
    except ImportError:
        raise UserError("RULER tasks need the wonderwords package (RULER's word lists): "
                        "pip install wonderwords") from None
    read = random_word._get_words_from_text_file
    return {"nouns": read("nounlist.txt"), "adjs": read("adjectivelist.txt"),
            "verbs": read("verblist.txt")}


@lru_cache(maxsize=1)
def _key_parts() -> tuple[list[str], list[str]]:
    w = wonder_words()
    return sorted(set(w["adjs"])), sorted(set(w["nouns"]))


def random_value(rng: random.Random, kind: str) -> str:
    """One needle key or value as RULER's ``generate_random``: a 7-digit number, an
    ``adjective-noun`` word or a version-4 UUID.

    RULER picks a word uniformly from the sorted set of all ``adj-noun`` pairs (6.2M strings);
    drawing the adjective and the noun uniformly gives the same distribution without building
    it."""
    if kind == "numbers":
        return str(rng.randint(10 ** 6, 10 ** 7 - 1))
    if kind == "words":
        adjs, nouns = _key_parts()
        return f"{rng.choice(adjs)}-{rng.choice(nouns)}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"unknown needle type {kind!r}; numbers, words or uuids")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (see the module docstring)."""
    return [s for s in _SENT_END.split(text.strip()) if s]


@dataclass(kw_only=True, frozen=True)
class Haystack:
    """The essay haystack as RULER holds it: the text's words (``re.sub(r'\\s+', ' ',
    essay).split(' ')``), and where it came from."""

    words: tuple[str, ...]
    """The text's words, as RULER splits them."""
    source: str
    """``builtin:...`` or the file's absolute path."""
    substitute: bool
    """True unless the file is named as RULER's ``PaulGrahamEssays.json``: by name only, since
    no reference copy of RULER's downloaded essays is at hand to compare content with."""
    chars: int = 0
    """Characters of the haystack text (what ``sha256`` covers)."""
    sha256: str = ""
    """SHA-256 of the haystack text (UTF-8), recorded so a reader can hold a run's haystack
    against RULER's own ``PaulGrahamEssays.json`` (or another run's) by content."""


def load_haystack(path: str | None = None) -> Haystack:
    """The essay haystack of ``--haystack path`` (``.json`` with a ``text`` field, as RULER's
    ``PaulGrahamEssays.json``, or UTF-8 text), or the shipped substitute."""
    if path is None:
        with gzip.open(BUILTIN_HAYSTACK, "rt", encoding="utf-8") as f:
            text = f.read()
        return Haystack(words=_words(text), source="builtin:shakespeare (public domain)",
                        substitute=True, **_identity(text))
    if not os.path.isfile(path):
        raise UserError(f"--haystack {path}: no such file; give a .txt file or RULER's "
                        "PaulGrahamEssays.json")
    try:
        with open(path, encoding="utf-8") as f:
            raw = f.read()
    except UnicodeDecodeError as exc:
        raise UserError(f"--haystack {path}: not UTF-8 text ({exc.reason})") from None
    if path.endswith(".json"):
        try:
            text = json.loads(raw)["text"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"--haystack {path}: not a JSON object with a string field "
                            "'text' (the format of RULER's PaulGrahamEssays.json)") from None
        if not isinstance(text, str):
            raise UserError(f"--haystack {path}: field 'text' is not a string")
    else:
        text = raw
    words = _words(text)
    if len(words) < 100:
        raise UserError(f"--haystack {path}: {len(words)} words; give a text of at least 100 "
                        "words")
    is_pg = os.path.basename(path) == "PaulGrahamEssays.json"
    return Haystack(words=words, source=os.path.abspath(path), substitute=not is_pg,
                    **_identity(text))


def _identity(text: str) -> dict[str, object]:
    return {"chars": len(text), "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}


def _words(text: str) -> tuple[str, ...]:
    return tuple(w for w in re.sub(r"\s+", " ", text).split(" ") if w)
