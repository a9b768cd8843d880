"""HumanEval judged as openai/human-eval's ``check_correctness`` judges: a completion that ends
the process before ``check`` runs (``sys.exit(0)``, ``exit()``, ``os._exit(0)``) fails, exit
status 0 alone is not a pass; and lm-eval's stop strings end generation (``until``), not a cut
after generating to EOS or the 1,024-token budget."""

from __future__ import annotations

import json
import os

import pytest

from megatron_endprompt.evaluation.short_text import humaneval
from megatron_endprompt.evaluation.core import runner
from tests.evaluation.tiny_tokenizers import FIXTURES

FIX = os.path.join(FIXTURES, "short_text")


@pytest.fixture(scope="module")
def problem():
    with open(os.path.join(FIX, "humaneval.jsonl"), encoding="utf-8") as f:
        return json.loads(f.readline())


@pytest.mark.parametrize("exit_call", ["sys.exit(0)", "os._exit(0)", "exit()",
                                       "raise SystemExit(0)"])
def test_exiting_before_the_tests_fails(problem, exit_call):
    """The completion ends the function and exits at module level, before ``check`` runs."""
    completion = f"    pass\nimport sys, os\n{exit_call}\n"
    res = humaneval.run_program(humaneval.program(problem, completion))
    assert not res["passed"] and res["result"].startswith("failed"), res


def test_canonical_solution_still_passes(problem):
    res = humaneval.run_program(humaneval.program(problem, problem["canonical_solution"]))
    assert res == {"passed": True, "result": "passed"}
    printing = humaneval.run_program("print('hello')\n")
    assert printing["passed"]


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    return (runner.load_model(tiny_model_dir, device="cpu", dtype="float32"),
            runner.load_tokenizer(tiny_model_dir))


def test_stop_strings_end_generation(model_and_tok):
    """A stop string taken from the model's own unstopped output ends generation at the token
    that completes it (lm-eval's ``until`` as a stopping criterion)."""
    model, tok = model_and_tok
    prompt = tok("def add(a, b):\n", add_special_tokens=True)["input_ids"]
    full = runner.greedy_generate(model, [prompt], max_new_tokens=48, pad_id=tok.pad_token_id)[0]
    assert len(full) == 48
    pieces = [tok.decode(full[:k], skip_special_tokens=True) for k in range(len(full) + 1)]
    stop = pieces[20][len(pieces[18]):]  # the text of tokens 18-19
    assert stop.strip()
    first = next(k for k in range(len(full) + 1) if stop in pieces[k])
    stopped = runner.greedy_generate(model, [prompt], max_new_tokens=48,
                                     pad_id=tok.pad_token_id, stop_strings=[stop],
                                     tokenizer=tok)[0]
    assert stopped == full[:first]


def test_humaneval_generates_with_its_stop_strings(model_and_tok, monkeypatch):
    """run_humaneval hands lm-eval's ``until`` to generation (the real generator runs; the spy
    only records what it was given)."""
    model, tok = model_and_tok
    seen = []
    real = runner.greedy_generate

    def spy(*args, **kwargs):
        seen.append(tuple(kwargs.get("stop_strings", ())))
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "greedy_generate", spy)
    res = humaneval.run_humaneval(model, tok, os.path.join(FIX, "humaneval.jsonl"), length=256,
                                  limit=1)
    assert seen == [humaneval.STOP]
    rec = res["samples"][0]
    assert not any(s in rec["completion"] for s in humaneval.STOP)
