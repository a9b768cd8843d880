"""HumanEval under ``--chat-template model`` follows lm-eval's ``humaneval_instruct``: the user
turn asks for the solution in a code block, the assistant turn is started with the prompt in an
opened block (continued, not closed), and the code is the generation up to the closing fence,
after the prompt. Fed the bare prompt as a user turn, a chat model's fenced answer was cut at
``\\ndef`` and appended to the prompt: a SyntaxError, ~0 by construction."""

from __future__ import annotations

import json
import os

from megatron_endprompt.evaluation.core import runner
from megatron_endprompt.evaluation.short_text import humaneval
from tests.evaluation.tiny_tokenizers import FIXTURES, build_tokenizer

#: A ChatML template (as SmolLM2-Instruct's): ``<|im_start|>role\ncontent<|im_end|>\n``.
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PROBLEM = json.loads(open(os.path.join(FIXTURES, "short_text", "humaneval.jsonl"),
                          encoding="utf-8").readline())


def _chat_tokenizer():
    tok = build_tokenizer("bytelevel", extra_text=("<|im_start|>", "<|im_end|>", "```python"))
    tok.chat_template = CHATML
    return tok


def test_instruct_prompt_is_lm_evals():
    tok = _chat_tokenizer()
    text = tok.decode(humaneval.instruct_ids(tok, PROBLEM))
    prompt = PROBLEM["prompt"]
    assert text == ("<|im_start|>user\nWrite a solution to the following problem and make sure "
                    f"that it passes the tests:\n```python\n{prompt}\n```\n<|im_end|>\n"
                    "<|im_start|>assistant\nHere is the completed function:\n```python\n"
                    f"{prompt}\n")


def test_code_block_extracted_and_passes(monkeypatch):
    tok = _chat_tokenizer()
    answer = "    return a + b\n```\n\nThis adds the two numbers."
    assert humaneval.instruct_completion(answer) == "    return a + b\n"

    def generate(model, prompts, **kwargs):  # the chat model's answer, as token ids
        return [tok(answer, add_special_tokens=False)["input_ids"]]

    class _Model:
        config = type("C", (), {"eos_token_id": tok.eos_token_id})()

    monkeypatch.setattr(runner, "greedy_generate", generate)
    res = humaneval.run_humaneval(_Model(), tok, os.path.join(FIXTURES, "short_text",
                                                              "humaneval.jsonl"),
                                  length=1024, limit=1, chat=True)
    assert res["samples"][0]["completion"] == "    return a + b\n"
    assert res["passed"] == 1 and res["protocol"] == "lm-eval humaneval_instruct (chat)"
