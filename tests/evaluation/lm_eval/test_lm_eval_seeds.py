"""Runs through lm-eval get lm-eval's own seeds (0 / 1234 / 1234 / 1234: its few-shot seed
draws GSM8K's and MMLU's shots) unless ``--seed`` is given, and the JSON says which (the short
text ran with --seed's default 42 for all four). ``simple_evaluate`` is stopped once called:
the arguments are the point, not the run."""

from __future__ import annotations

import os

import pytest

from megatron_endprompt.cli import eval as eval_cli
from megatron_endprompt.evaluation.core import runner
from megatron_endprompt.evaluation.short_text.run import run_short_text
from tests.evaluation.tiny_tokenizers import FIXTURES

lm_eval = pytest.importorskip("lm_eval")
SEED_KEYS = ("random_seed", "numpy_random_seed", "torch_random_seed", "fewshot_random_seed")
#: lm-eval 0.4.13's ``simple_evaluate`` defaults.
LM_EVAL_DEFAULT_SEEDS = dict(zip(SEED_KEYS, (0, 1234, 1234, 1234)))


class _Stop(Exception):
    pass


@pytest.fixture
def captured(monkeypatch):
    got: dict = {}

    def fake(**kwargs):
        got.update(kwargs)
        raise _Stop

    monkeypatch.setattr(lm_eval, "simple_evaluate", fake)
    return got


def test_defaults_are_lm_evals():
    import inspect

    from megatron_endprompt.evaluation.lm_eval.seeds import lm_eval_seeds

    defaults = inspect.signature(lm_eval.simple_evaluate).parameters
    assert {k: defaults[k].default for k in SEED_KEYS} == LM_EVAL_DEFAULT_SEEDS
    assert lm_eval_seeds(None) == LM_EVAL_DEFAULT_SEEDS
    assert lm_eval_seeds(7) == dict.fromkeys(SEED_KEYS, 7)


@pytest.mark.parametrize("seed, want", [(None, LM_EVAL_DEFAULT_SEEDS),
                                        (7, dict.fromkeys(SEED_KEYS, 7))])
def test_short_text_seeds(tiny_model_dir, tmp_path, captured, seed, want):
    root = tmp_path / "st"
    root.mkdir()
    for name in ("gsm8k_test.jsonl", "gsm8k_train.jsonl"):
        (root / name).write_bytes(open(os.path.join(FIXTURES, "short_text", name), "rb").read())
    model = runner.load_model(tiny_model_dir, device="cpu", dtype="float32")
    tok = runner.load_tokenizer(tiny_model_dir)
    with pytest.raises(_Stop):
        run_short_text(model, tok, str(root), length=2048, seed=seed)
    assert {k: captured[k] for k in SEED_KEYS} == want
    # only the run's own task files are indexed, not lm-eval's built-in tasks
    indexed = captured["task_manager"].all_tasks
    assert "endprompt_gsm8k" in indexed and "gsm8k" not in indexed, len(indexed)


@pytest.mark.parametrize("flags, want", [([], LM_EVAL_DEFAULT_SEEDS),
                                         (["--seed", "5"], dict.fromkeys(SEED_KEYS, 5))])
def test_backend_seeds(tiny_model_dir, tmp_path, run_tool, captured, flags, want):
    from tests.evaluation.lm_eval.test_eval_lm_eval import _task_dir

    tasks = _task_dir(tmp_path / "tasks", "tiny_qa")
    with pytest.raises(_Stop):
        run_tool(eval_cli.main, [
            "--hf-dir", tiny_model_dir, "--backend", "lm-eval", "--lm-eval-include", tasks,
            "--tasks", "tiny_qa", "--lengths", "512", "--device", "cpu", "--output",
            tmp_path / "out" / "r.json", "--no-progress", *flags])
    assert {k: captured[k] for k in SEED_KEYS} == want
