"""HumanEval under ``--chat-template model`` on the real chat checkpoint (SmolLM2-135M-Instruct,
``real_checkpoint.py``), held against lm-eval 0.4.13's own ``humaneval_instruct`` as installed:

* the rendered prompt is token-identical to what lm-eval feeds an HF chat model: its task YAML's
  ``doc_to_text`` as the user turn and its ``gen_prefix`` as a started assistant turn
  (``HFLM.apply_chat_template``: ``add_generation_prompt=False, continue_final_message=True``);
* the extracted code equals lm-eval's filter (``build_predictions_instruct``, read from the
  installed ``utils.py``: importing that module loads HF ``evaluate``'s ``code_eval`` from the
  hub, which this machine cannot reach);
* a correct fenced answer passes, and the real model's own greedy answer runs end to end.
"""

from __future__ import annotations

import ast
import json
import os

import jinja2
import lm_eval
import pytest
import yaml

from megatron_endprompt.evaluation.core import runner
from megatron_endprompt.evaluation.short_text import humaneval
from tests.evaluation.tiny_tokenizers import FIXTURES

pytestmark = pytest.mark.e2e

HUMANEVAL = os.path.join(FIXTURES, "short_text", "humaneval.jsonl")
TASK_DIR = os.path.join(os.path.dirname(lm_eval.__file__), "tasks", "humaneval")


def _task_yaml() -> dict:
    class Loader(yaml.SafeLoader):  # lm-eval's ``!function`` tags name filters: keep the text
        pass

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    with open(os.path.join(TASK_DIR, "humaneval_instruct.yaml"), encoding="utf-8") as f:
        return yaml.load(f, Loader=Loader)


def _lm_eval_filter():
    """``build_predictions_instruct`` from lm-eval's installed ``utils.py``, the function alone."""
    with open(os.path.join(TASK_DIR, "utils.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
              and n.name == "build_predictions_instruct")
    scope: dict = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "lm_eval_utils", "exec"), scope)
    return scope["build_predictions_instruct"]


@pytest.fixture(scope="module")
def smollm2():
    from real_checkpoint import smollm2_hf_dir

    hf_dir = smollm2_hf_dir()
    return runner.load_tokenizer(hf_dir), runner.load_model(hf_dir, device="cpu",
                                                             dtype="float32")


def test_prompt_and_extraction_are_lm_evals_on_the_real_chat_model(smollm2):
    tok, _ = smollm2
    cfg = _task_yaml()
    with open(HUMANEVAL, encoding="utf-8") as f:
        problems = [json.loads(line) for line in f]
    for p in problems:
        user = jinja2.Template(cfg["doc_to_text"], keep_trailing_newline=True).render(**p)
        prefix = jinja2.Template(cfg["gen_prefix"], keep_trailing_newline=True).render(**p)
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": user}, {"role": "assistant", "content": prefix}],
            tokenize=False, add_generation_prompt=False, continue_final_message=True)
        assert humaneval.instruct_ids(tok, p) == tok(rendered, add_special_tokens=False)[
            "input_ids"], p["task_id"]
        answer = p["canonical_solution"] + "```\n\nThis solves it."
        program = _lm_eval_filter()([[answer]], [p])[0][0]
        assert p["prompt"] + humaneval.instruct_completion(answer) == program


def test_a_correct_answer_passes_and_the_model_runs(smollm2, monkeypatch):
    tok, model = smollm2
    res = humaneval.run_humaneval(model, tok, HUMANEVAL, length=1024, limit=1, chat=True)
    assert res["protocol"] == "lm-eval humaneval_instruct (chat)" and res["problems"] == 1
    assert res["samples"][0]["generated_tokens"] > 0  # the real model's own greedy answer

    def canonical(model, prompts, **kwargs):  # a correct chat answer, fenced, with prose after
        return [tok("    return a + b\n```\n\nThis adds them.",
                    add_special_tokens=False)["input_ids"]]

    monkeypatch.setattr(runner, "greedy_generate", canonical)
    res = humaneval.run_humaneval(model, tok, HUMANEVAL, length=1024, limit=1, chat=True)
    assert res["passed"] == 1 and res["samples"][0]["completion"] == "    return a + b\n"
