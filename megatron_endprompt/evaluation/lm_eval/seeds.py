"""The seeds every run through lm-eval gets: lm-eval's own defaults unless ``--seed`` is given.

lm-eval 0.4.13's ``simple_evaluate`` seeds Python's ``random`` with 0 and numpy, torch and the
few-shot sampler with 1234; GSM8K's and MMLU's shots are drawn by the few-shot seed, so a
table read against lm-eval's (or a paper's made with it) has lm-eval's shots only with these.
``--seed N`` sets all four to N. The JSON records which were used."""

from __future__ import annotations

__all__ = ["LM_EVAL_DEFAULT_SEEDS", "lm_eval_seeds"]

#: ``simple_evaluate``'s defaults (lm-eval 0.4.13, ``evaluator.py``).
LM_EVAL_DEFAULT_SEEDS = {"random_seed": 0, "numpy_random_seed": 1234, "torch_random_seed": 1234,
                         "fewshot_random_seed": 1234}


def lm_eval_seeds(seed: int | None) -> dict[str, int]:
    """``simple_evaluate``'s seed arguments: lm-eval's defaults for ``None``, else ``seed`` for
    all four."""
    if seed is None:
        return dict(LM_EVAL_DEFAULT_SEEDS)
    return {key: seed for key in LM_EVAL_DEFAULT_SEEDS}
