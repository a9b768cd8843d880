"""RULER's aggregation prompts: ``cwe`` (common words extraction) and ``fwe`` (frequent words
extraction).

Our code, following RULER ``scripts/data/synthetic/common_words_extraction.py``
(``get_example``, ``generate_input_output``) and ``freq_words_extraction.py``
(``generate_input_output``, ``sys_kwext``), quirks included: the word lists are shuffled by a
generator seeded with the run seed alone, so every prompt of a run uses the same order.
"""

from __future__ import annotations

import math
import random
import string
from collections.abc import Callable
from functools import lru_cache

from megatron_endprompt.evaluation.ruler.niah import Rendered
from megatron_endprompt.evaluation.ruler.sources import wonder_words
from megatron_endprompt.evaluation.ruler.spec import RulerTask, ruler_template

__all__ = ["cwe_words", "render_cwe", "TooManyWords", "zeta", "fwe_vocab", "render_fwe",
           "fit_fwe"]


class TooManyWords(ValueError):
    """``cwe`` asked for more distinct words than wonderwords has (about 8.7K, reached near
    128K tokens; RULER then draws from its own ``english_words.json``, which we do not ship)."""


@lru_cache(maxsize=4)
def cwe_words(seed: int) -> tuple[str, ...]:
    """RULER: ``sorted(set(nouns + adjs + verbs))`` shuffled by ``Random(seed)``."""
    w = wonder_words()
    words = sorted(set(w["nouns"] + w["adjs"] + w["verbs"]))
    random.Random(seed).shuffle(words)
    return tuple(words)


def _cwe_example(rng: random.Random, seed: int, num_words: int, common_repeats: int,
                 uncommon_repeats: int, common_nums: int) -> tuple[str, list[str]]:
    words = cwe_words(seed)
    if num_words > len(words):
        raise TooManyWords(f"cwe needs {num_words} distinct words; wonderwords has "
                           f"{len(words)}")
    full = rng.sample(words, num_words)
    common, uncommon = full[:common_nums], full[common_nums:]
    word_list = common * int(common_repeats) + uncommon * int(uncommon_repeats)
    random.Random(seed).shuffle(word_list)
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(word_list)), common


def render_cwe(task: RulerTask, n: int, rng: random.Random, *, seed: int,
               length: int) -> Rendered:
    """One ``cwe`` prompt of ``n`` distinct words: one solved example, then the question.
    Below 4096 tokens RULER uses smaller repeat counts (``args.max_seq_length < 4096``)."""
    a = task.args
    num_cw = int(a["num_cw"])  # type: ignore[call-overload]
    template = ruler_template("common_words_extraction")
    if length < 4096:
        shot = _cwe_example(rng, seed, 20, 3, 1, num_cw)
        context, answer = _cwe_example(rng, seed, n, 6, 1, num_cw)
    else:
        shot = _cwe_example(rng, seed, 40, 10, 3, num_cw)
        freq_cw, freq_ucw = int(a["freq_cw"]), int(a["freq_ucw"])  # type: ignore[call-overload]
        context, answer = _cwe_example(rng, seed, n, freq_cw, freq_ucw, num_cw)
    shots = template.format(num_cw=num_cw, context=shot[0], query="") + " " + " ".join(
        f"{i + 1}. {w}" for i, w in enumerate(shot[1]))
    text = shots + "\n" + template.format(num_cw=num_cw, context=context, query="")
    return Rendered(text=text, answers=tuple(answer))


def zeta(alpha: float) -> float:
    """Riemann zeta for ``alpha > 1`` (RULER uses ``scipy.special.zeta``): the sum to 10^4 plus
    the Euler-Maclaurin tail, exact to ~1e-15 for the alphas that matter."""
    if alpha <= 1:
        raise ValueError("zeta needs alpha > 1")
    n = 10_000
    head = math.fsum(k ** -alpha for k in range(1, n))
    return head + n ** (1 - alpha) / (alpha - 1) + 0.5 * n ** -alpha \
        + alpha * n ** (-alpha - 1) / 12


def fwe_vocab(rng: random.Random, seed: int, vocab_size: int, wordlen: int = 6) -> list[str]:
    """RULER: ``vocab_size`` distinct random lowercase words, sorted, shuffled by
    ``Random(seed)``, the top-ranked one replaced by ``...`` (noise)."""
    vocab = ["".join(rng.choices(string.ascii_lowercase, k=wordlen)) for _ in range(vocab_size)]
    while len(set(vocab)) < vocab_size:
        vocab.append("".join(rng.choices(string.ascii_lowercase, k=wordlen)))
    vocab = sorted(set(vocab))
    random.Random(seed).shuffle(vocab)
    vocab[0] = "..."
    return vocab


def render_fwe(task: RulerTask, num_words: int, vocab: list[str], *, seed: int) -> Rendered:
    """One ``fwe`` prompt: word ``k`` (1-based rank) appears ``int(num_words k^-alpha /
    zeta(alpha))`` times, shuffled; the answer is ranks 2-4 (rank 1 is the dots)."""
    alpha = float(task.args["alpha"])  # type: ignore[arg-type]
    z = zeta(alpha)
    sampled = [w for k, w in enumerate(vocab, 1) for _ in range(int(num_words * k ** -alpha / z))]
    random.Random(seed).shuffle(sampled)
    text = ruler_template("freq_words_extraction").format(context=" ".join(sampled), query="")
    return Rendered(text=text, answers=tuple(vocab[1:4]))


def fit_fwe(task: RulerTask, rng: random.Random, *, seed: int, length: int,
            count: Callable[[str], int], num_words: int | None = None) -> tuple[Rendered, int]:
    """RULER ``sys_kwext``: ``max_len = length - tokens_to_generate``, vocabulary
    ``max_len // 50``, one vocabulary drawn per call (as ``generate_input_output``); without
    ``num_words`` grow it from ``max_len // 6`` by ``max_len // 32`` until the prompt reaches
    ``max_len`` and step back once. RULER then only shrinks a sample's count by that step while
    its prompt (another vocabulary: the top words' spelling moves the count by several percent)
    is too long; we take the largest word count that fits with the sample's vocabulary (down by
    the step until it fits, up by the step while it fits, then a binary search between), so
    every prompt fills ``max_len`` to within a word or two. Returns the prompt and the word
    count it used."""
    max_len = length - task.tokens_to_generate
    inc = max(1, max_len // 32)
    vocab = fwe_vocab(rng, seed, max(4, max_len // 50))

    def render(words: int) -> Rendered:
        return render_fwe(task, words, vocab, seed=seed)

    def fits(words: int) -> bool:
        return count(render(words).text) <= max_len

    if num_words is None:
        num_words = max_len // 6
        while not count(render(num_words).text) >= max_len:
            num_words += inc
        num_words -= inc
    lower = num_words
    while not fits(lower):
        if lower <= inc:
            raise ValueError(f"fwe: length {length} leaves no room for the coded text")
        lower -= inc
    upper = lower + inc
    while fits(upper):
        lower, upper = upper, upper + inc
    while upper - lower > 1:  # lower fits, upper does not
        mid = (lower + upper) // 2
        lower, upper = (mid, upper) if fits(mid) else (lower, mid)
    return render(lower), lower
