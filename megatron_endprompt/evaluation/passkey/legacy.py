"""The pre-RULER retrieval prompts (``legacy_*`` tasks: inline passkey needle, a generated
grammar haystack, prompts of exactly ``length`` tokens), kept for comparing old results.

Prompts are built in token ids of the evaluated model's tokenizer, never by re-tokenizing long
text: every text piece (task intro, filler sentences, needles, question) is tokenized once, then
the haystack is a slice of a filler token stream, and needle ids are inserted into it. Work per
prompt is linear in its length.

Needles go at sentence boundaries of the haystack nearest to the requested depth (so no word is
cut around a needle); the achieved depth (haystack tokens before the needle / haystack tokens)
differs from the requested one by less than one filler sentence and is recorded per sample.
Only the haystack's first sentence may be cut (the window is cut to length at its start).

Each sample draws its randomness from ``numpy.random.default_rng`` seeded with
``(seed, task, length, depth, index)``, so a prompt does not change when other lengths, depths
or tasks are added to a run.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "NIAH_TASKS", "RETRIEVAL_TASKS", "Sample", "PromptTokens", "Filler", "make_samples",
    "build_sample", "prompt_overhead", "needle_targets",
    "PASSKEY_INTRO", "PASSKEY_FILLER", "PASSKEY_QUESTION", "passkey_needle", "niah_needle",
]

PASSKEY_INTRO = ("There is an important info hidden inside a lot of irrelevant text. "
                 "Find it and memorize them. I will quiz you about the important information "
                 "there.")
PASSKEY_FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
                  "There and back again.")
PASSKEY_QUESTION = "What is the pass key? The pass key is"

NIAH_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to "
              "memorize it. I will quiz you about the numbers afterwards.")
NIAH_QUESTION = ("What are all the special magic numbers for {query} mentioned in the provided "
                 "text? The special magic numbers for {query} mentioned in the provided text "
                 "are")

#: NIAH variants: (keys in the haystack, values per key, keys queried). As RULER's niah_single,
#: niah_multikey, niah_multivalue and niah_multiquery.
NIAH_TASKS: dict[str, tuple[int, int, int]] = {
    "niah_single": (1, 1, 1),
    "niah_multikey": (4, 1, 1),
    "niah_multivalue": (1, 4, 1),
    "niah_multiquery": (4, 1, 4),
}
RETRIEVAL_TASKS: tuple[str, ...] = ("passkey", *NIAH_TASKS)

_ADJECTIVES = ("amber", "brave", "calm", "dusty", "eager", "faint", "gentle", "hollow", "icy",
               "jolly", "keen", "lively", "mellow", "nimble", "odd", "plain", "quiet", "rapid",
               "silent", "tidy", "upbeat", "vivid", "wary", "young", "zesty", "bold", "crisp")
_NOUNS = ("anchor", "badger", "canyon", "dolphin", "engine", "falcon", "glacier", "harbor",
          "island", "jacket", "kettle", "lantern", "meadow", "needle", "orchid", "pepper",
          "quarry", "rocket", "saddle", "tunnel", "violin", "walrus", "yacht", "zephyr")

# Essay-like haystack: sentences from a small grammar, fixed pool (no digits, no "magic").
_E_SUBJ = ("Most founders", "A good essay", "The best startups", "Every programmer",
           "Young writers", "A small team", "The first version", "Good ideas", "Investors",
           "A careful reader", "Most schools", "The hardest problems", "Experienced makers",
           "A new city", "The old rules", "Curious people")
_E_VERB = ("tend to underestimate", "rarely notice", "often rediscover", "quietly depend on",
           "learn to ignore", "slowly grow into", "eventually question", "keep returning to",
           "are shaped by", "seldom talk about", "gradually replace", "care deeply about")
_E_OBJ = ("the value of doing things that do not scale", "how long it takes to build "
          "something people want", "the small details of their daily work", "the advice "
          "of people who have done it before", "the habits they formed early on",
          "the difference between work and play", "the questions nobody else is asking",
          "the cost of making decisions too slowly", "what their users actually do",
          "the patience that real progress requires", "the ordinary things around them",
          "the shape of the problem in front of them")
_E_TAIL = ("", ", and that is usually a good sign", " when nobody is watching",
           " in the long run", ", even if it feels strange at first", " more than they admit",
           " once the initial excitement fades", ", which is easy to forget")


@dataclass(kw_only=True, frozen=True)
class Sample:
    """One retrieval prompt.

    ``input_ids`` has exactly ``length`` tokens (BOS included when the tokenizer adds one).
    ``needle_starts`` are the token indices of the needles in ``input_ids`` (the queried needle
    first); ``needle_depths`` their achieved depths in the haystack (0 = right after the intro,
    1 = right before the question). ``answers`` are the reference strings; ``metric`` is
    ``"passkey_exact"`` or ``"string_match_all"``. ``haystack`` is the ``[start, end)`` token
    span between the intro and the question (filler and needles).
    """

    task: str
    length: int
    depth: float
    index: int
    input_ids: tuple[int, ...]
    answers: tuple[str, ...]
    metric: str
    needle_starts: tuple[int, ...]
    needle_depths: tuple[float, ...]
    needle_ids: tuple[tuple[int, ...], ...]
    haystack: tuple[int, int]
    max_new_tokens: int


class PromptTokens:
    """Tokenizes prompt pieces with an HF tokenizer as they read *inside* a text.

    A piece such as ``" The sky is blue."`` is tokenized after an anchor (``"."``) whose tokens
    are then dropped, so SentencePiece (``▁The``) and byte-level BPE (``ĠThe``) tokenizers both
    give the ids the piece has mid-text. Results are cached.
    """

    _ANCHORS = (".", "a", "\n")

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._cache: dict[str, tuple[int, ...]] = {}
        ids = tokenizer("a", add_special_tokens=True)["input_ids"]
        bos = tokenizer.bos_token_id
        self.bos: tuple[int, ...] = (bos,) if bos is not None and ids and ids[0] == bos else ()

    def _plain(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def start(self, text: str) -> tuple[int, ...]:
        """Ids of ``text`` at the start of a document (no special tokens)."""
        return tuple(self._plain(text))

    def piece(self, text: str) -> tuple[int, ...]:
        """Ids of ``text`` (usually starting with a space or newline) following other text."""
        hit = self._cache.get(text)
        if hit is not None:
            return hit
        out: tuple[int, ...] | None = None
        for anchor in self._ANCHORS:
            head = self._plain(anchor)
            both = self._plain(anchor + text)
            if both[:len(head)] == head:
                out = tuple(both[len(head):])
                break
        if out is None:
            out = tuple(self._plain(text))
        self._cache[text] = out
        return out


class Filler:
    """A haystack token stream: sentences tokenized once, drawn (``essay``) or repeated
    (``repeat``: the passkey filler) until long enough, and cut to an exact length."""

    def __init__(self, tokens: PromptTokens, kind: str):
        if kind == "repeat":
            sents = [s if s.endswith(".") else s + "." for s in PASSKEY_FILLER.split(". ")]
        elif kind == "essay":
            sents = _essay_pool()
        else:
            raise ValueError(f"unknown haystack {kind!r}; use essay or repeat")
        self.kind = kind
        self.sentences = [np.asarray(tokens.piece(" " + s), dtype=np.int64) for s in sents]
        self.lengths = np.array([len(s) for s in self.sentences], dtype=np.int64)
        self.max_sentence = int(self.lengths.max())

    def window(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, boundaries)``: ``n`` filler tokens ending at a sentence end, and the sorted
        token offsets where a needle may go without cutting a sentence: sentence ends (``n``
        included), and 0 only when the window starts at a sentence start (else the window opens
        with the tail of a cut sentence, and a needle at depth 0 goes right after it)."""
        k = len(self.sentences)
        if self.kind == "repeat":
            reps = n // int(self.lengths.sum()) + 2
            order = np.tile(np.arange(k), reps)
        else:
            count = int(n // max(1, int(self.lengths.min()))) + 2
            order = rng.integers(0, k, size=count)
        ends = np.cumsum(self.lengths[order])
        last = int(np.searchsorted(ends, n))  # first sentence whose end reaches n
        order = order[:last + 1]
        ids = np.concatenate([self.sentences[i] for i in order])
        cut = len(ids) - n
        ids = ids[cut:]
        bounds = ends[:last + 1] - cut
        bounds = np.unique(np.concatenate([bounds[bounds >= 0], [n]]))
        if cut == 0:
            bounds = np.unique(np.concatenate([[0], bounds]))
        return ids, bounds


def _essay_pool() -> list[str]:
    """The fixed pool of essay-like sentences (independent of the run's seed)."""
    rng = np.random.default_rng(20240917)
    out = []
    for _ in range(600):
        s = (f"{_E_SUBJ[rng.integers(len(_E_SUBJ))]} {_E_VERB[rng.integers(len(_E_VERB))]} "
             f"{_E_OBJ[rng.integers(len(_E_OBJ))]}{_E_TAIL[rng.integers(len(_E_TAIL))]}.")
        out.append(s)
    return out


def passkey_needle(key: int) -> str:
    """The passkey sentence (landmark-attention wording)."""
    return f"The pass key is {key}. Remember it. {key} is the pass key."


def niah_needle(key: str, value: str) -> str:
    """One RULER-style needle."""
    return f"One of the special magic numbers for {key} is: {value}."


def _rng(seed: int, task: str, length: int, depth: float, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(task.encode()), length,
                                  int(round(depth * 1_000_000)), index])


def needle_targets(task: str, depth: float) -> list[float]:
    """Requested depths of the needles of ``task`` (queried needle first): one needle at
    ``depth``; ``k`` needles evenly spaced (cyclically), the first at ``depth``."""
    if task == "passkey":
        return [depth]
    n_keys, n_values, _ = NIAH_TASKS[task]
    return _positions(depth, n_keys * n_values)


def _positions(depth: float, k: int) -> list[float]:
    """``k`` evenly spaced (cyclically) depths, the first at ``depth``."""
    out = []
    for j in range(k):
        p = depth + j / k
        out.append(p - 1.0 if p > 1.0 else p)
    return out


def _assemble(*, head: tuple[int, ...], tail: tuple[int, ...], needles: list[tuple[int, ...]],
              positions: list[float], filler: Filler, length: int, rng: np.random.Generator,
              task: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]:
    """Head + haystack with needles at ``positions`` + tail, exactly ``length`` tokens."""
    overhead = len(head) + len(tail) + sum(len(n) for n in needles)
    budget = length - overhead
    if budget < 1:
        raise ValueError(f"{task}: length {length} leaves no room for a haystack (the prompt "
                         f"without filler takes {overhead} tokens); use a longer length")
    hay, bounds = filler.window(rng, budget)
    snapped = []
    for p in positions:
        target = p * budget
        i = int(np.searchsorted(bounds, target))
        cands = [int(bounds[j]) for j in (i - 1, i) if 0 <= j < len(bounds)]
        snapped.append(min(cands, key=lambda b: (abs(b - target), b)))
    order = sorted(range(len(needles)), key=lambda j: (snapped[j], j))
    parts: list[np.ndarray] = [np.asarray(head, dtype=np.int64)]
    starts = [0] * len(needles)
    prev, pos = 0, len(head)
    for j in order:
        b = snapped[j]
        parts.append(hay[prev:b])
        pos += b - prev
        starts[j] = pos
        parts.append(np.asarray(needles[j], dtype=np.int64))
        pos += len(needles[j])
        prev = b
    parts.append(hay[prev:])
    parts.append(np.asarray(tail, dtype=np.int64))
    ids = np.concatenate(parts)
    assert len(ids) == length, (len(ids), length)
    depths = tuple(b / budget for b in snapped)
    return tuple(int(t) for t in ids), tuple(starts), depths


@dataclass(kw_only=True, frozen=True)
class _Parts:
    """A prompt without its haystack."""

    head: tuple[int, ...]
    tail: tuple[int, ...]
    needles: list[tuple[int, ...]]
    positions: list[float]
    answers: tuple[str, ...]
    metric: str
    answer_text: str

    @property
    def overhead(self) -> int:
        return len(self.head) + len(self.tail) + sum(len(n) for n in self.needles)


def _parts(task: str, tokens: PromptTokens, rng: np.random.Generator, depth: float,
           widest: bool = False) -> _Parts:
    """Head, needles, question and answers of one prompt (``widest``: largest values, for the
    overhead estimate)."""
    head_text = PASSKEY_INTRO if task == "passkey" else NIAH_INTRO
    # a tokenizer whose normaliser drops newlines (some SentencePiece models) gets a space
    head = tokens.bos + tokens.start(head_text) + (tokens.piece("\n") or tokens.piece(" "))
    if task == "passkey":
        key = 50000 if widest else int(rng.integers(1, 50001))
        return _Parts(head=head, tail=tokens.piece("\n" + PASSKEY_QUESTION),
                      needles=[tokens.piece(" " + passkey_needle(key))], positions=[depth],
                      answers=(str(key),), metric="passkey_exact", answer_text=f" {key}.")
    if task not in NIAH_TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {', '.join(RETRIEVAL_TASKS)}")
    n_keys, n_values, n_query = NIAH_TASKS[task]
    keys = _draw_keys(rng, n_keys)
    if widest:
        values = [["9999999"] * n_values for _ in keys]
    else:
        flat = rng.choice(9_000_000, size=n_keys * n_values, replace=False) + 1_000_000
        values = [[str(int(v)) for v in flat[i * n_values:(i + 1) * n_values]]
                  for i in range(n_keys)]
    query_keys = keys[:n_query]
    query = (query_keys[0] if n_query == 1
             else ", ".join(query_keys[:-1]) + ", and " + query_keys[-1])
    pairs = [(k, v) for i, k in enumerate(keys) for v in values[i]]
    needles = [tokens.piece(" " + niah_needle(k, v)) for k, v in pairs]
    answers = tuple(v for i in range(n_query) for v in values[i])
    return _Parts(head=head, tail=tokens.piece("\n" + NIAH_QUESTION.format(query=query)),
                  needles=needles, positions=_positions(depth, len(needles)), answers=answers,
                  metric="string_match_all", answer_text=" " + ", ".join(answers) + ".")


def prompt_overhead(task: str, tokens: PromptTokens, *, draws: int = 16) -> int:
    """Tokens of a ``task`` prompt that are not haystack: the most over the widest values and
    ``draws`` random draws (keys and values tokenize to varying lengths), plus 2 tokens of
    slack. Lengths above it leave room for a haystack."""
    worst = _parts(task, tokens, _rng(0, task, 0, 0.0, 0), 0.0, widest=True).overhead
    for i in range(draws):
        worst = max(worst, _parts(task, tokens, _rng(i, task, 0, 0.0, i), 0.0).overhead)
    return worst + 2


def build_sample(task: str, tokens: PromptTokens, filler: Filler, *, length: int,
                 depth: float, index: int, seed: int) -> Sample:
    """One prompt of ``task`` with exactly ``length`` tokens, needle(s) at ``depth``."""
    rng = _rng(seed, task, length, depth, index)
    parts = _parts(task, tokens, rng, depth)
    ids, starts, depths = _assemble(head=parts.head, tail=parts.tail, needles=parts.needles,
                                    positions=parts.positions, filler=filler, length=length,
                                    rng=rng, task=task)
    return Sample(task=task, length=length, depth=depth, index=index, input_ids=ids,
                  answers=parts.answers, metric=parts.metric, needle_starts=starts,
                  needle_depths=depths, needle_ids=tuple(tuple(n) for n in parts.needles),
                  haystack=(len(parts.head), length - len(parts.tail)),
                  max_new_tokens=len(tokens.piece(parts.answer_text)) + 6)


def _draw_keys(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` distinct ``adjective-noun`` keys."""
    idx = rng.choice(len(_ADJECTIVES) * len(_NOUNS), size=n, replace=False)
    return [f"{_ADJECTIVES[i // len(_NOUNS)]}-{_NOUNS[i % len(_NOUNS)]}" for i in idx]


def make_samples(task: str, tokens: PromptTokens, *, lengths: list[int], depths: list[float],
                 samples: int, seed: int, haystack: str | None = None,
                 fillers: dict[str, Filler] | None = None) -> list[Sample]:
    """All prompts of ``task`` for every (length, depth, sample index), in that order.

    ``haystack``: ``repeat`` or ``essay`` (default: ``repeat`` for passkey, ``essay`` for NIAH).
    ``fillers`` caches tokenized fillers across tasks.
    """
    kind = haystack or ("repeat" if task == "passkey" else "essay")
    cache = fillers if fillers is not None else {}
    if kind not in cache:
        cache[kind] = Filler(tokens, kind)
    filler = cache[kind]
    out = []
    for length in lengths:
        for depth in depths:
            for i in range(samples):
                out.append(build_sample(task, tokens, filler, length=length, depth=depth,
                                        index=i, seed=seed))
    return out
