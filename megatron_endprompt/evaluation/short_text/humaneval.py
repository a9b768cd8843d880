"""HumanEval pass@1 (greedy) with completions executed in a sandboxed subprocess.

Protocol as lm-eval 0.4.13's ``humaneval`` task (``lm_eval/tasks/humaneval/humaneval.yaml``):
prompt = the item's ``prompt``; greedy, at most 1024 new tokens (fewer when the context is
shorter), generation stopped at the first of ``"\\nclass"``, ``"\\ndef"``, ``"\\n#"``,
``"\\nif"``, ``"\\nprint"`` (lm-eval's ``until``: a stop criterion during generation) and
the text cut there; program = ``prompt + completion`` then ``test`` then ``check(entry_point)``
(the HumanEval/``code_eval`` check). lm-eval scores it with HF ``evaluate``'s ``code_eval``,
which is a hub download; we execute the programs ourselves, judged as openai/human-eval's
``execution.check_correctness`` judges them: the program is ``exec``'d with fresh globals and
passes only when ``exec`` returns; a ``SystemExit`` (``sys.exit(0)``, ``exit()``) or any other
exception fails it ("failed: ..."), and a process that ends before ``exec`` returns
(``os._exit(0)``) fails it too (human-eval: no result, "timed out"; here: "failed: exited
before the tests finished"). Exit status 0 alone is not a pass: the runner writes a random
marker after ``exec`` returns and the pass needs that marker. Input: a JSONL file in HumanEval's
format (``task_id``, ``prompt``, ``canonical_solution``, ``test``, ``entry_point``).

Chat models (``--chat-template model``) follow lm-eval's ``humaneval_instruct``
(``humaneval_instruct.yaml``): the user turn asks for a solution to the problem in a code
block (:data:`INSTRUCT_TEXT`), the assistant turn is started with :data:`INSTRUCT_PREFIX` (the
problem's prompt inside an opened code block; the template continues that message, lm-eval's
``gen_prefix``), generation stops at the same strings, and the code is the generated text up to
the first closing fence, appended to the prompt (``utils.build_predictions_instruct``). Fed the
base prompt instead, a chat model answers with a fenced block that cannot follow the
prompt's signature: ~0 by construction.

The sandbox (:func:`run_program`) is a separate ``python -I`` process (isolated mode: no user
site-packages, no ``PYTHON*`` environment variables, script directory not on ``sys.path``)
started with an empty environment in a fresh empty temporary directory (its cwd, deleted
afterwards), stdin closed, killed after ``timeout`` seconds (wall clock), and limited by
``resource.setrlimit`` to ``timeout`` + 1 CPU seconds, 2 GiB of address space, 16 MiB files
written and no core dumps. It is NOT a security boundary: the process runs as the same user,
can read any file that user can, and has whatever network access the machine has (nothing
blocks sockets); only run model output you would run yourself, on a machine without secrets.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import tempfile
from typing import Any

from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation.core import runner
from megatron_endprompt.evaluation.core.local_jsonl import read_items

__all__ = ["STOP", "TIMEOUT", "INSTRUCT_TEXT", "INSTRUCT_PREFIX", "instruct_ids",
           "instruct_completion", "load_problems", "truncate_completion", "program", "run_program",
           "run_humaneval"]

STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
#: lm-eval 0.4.13 ``humaneval_instruct``'s ``doc_to_text`` and ``gen_prefix``.
INSTRUCT_TEXT = ("Write a solution to the following problem and make sure that it passes the "
                 "tests:\n```python\n{prompt}\n```\n")
INSTRUCT_PREFIX = "Here is the completed function:\n```python\n{prompt}\n"
MAX_GEN_TOKS = 1024
#: Seconds a program may run: human-eval's ``check_correctness`` default and lm-eval's
#: ``code_eval`` (``timeout=3.0``); a slower solution fails as "timed out" there too.
TIMEOUT = 3.0
_FIELDS = ("task_id", "prompt", "test", "entry_point")
_MEMORY = 2 << 30
_FILE = 16 << 20


def load_problems(path: str, limit: int = 0) -> list[dict[str, Any]]:
    """HumanEval problems of a JSONL file (the first ``limit`` when > 0)."""
    return read_items(path, fields=_FIELDS, flag="--short-text-dir", benchmark="HumanEval",
                      noun="problem", limit=limit)


def truncate_completion(text: str) -> str:
    """``text`` up to the first stop sequence (lm-eval's ``until``)."""
    cut = min((i for i in (text.find(s) for s in STOP) if i >= 0), default=len(text))
    return text[:cut]


def instruct_ids(tokenizer: Any, problem: dict[str, Any]) -> list[int]:
    """``humaneval_instruct``'s prompt ids: the user turn and the started assistant turn in the
    tokenizer's chat template (the template continues the assistant's message)."""
    messages = [{"role": "user", "content": INSTRUCT_TEXT.format(prompt=problem["prompt"])},
                {"role": "assistant", "content": INSTRUCT_PREFIX.format(prompt=problem["prompt"])}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=False,
                                             continue_final_message=True)
    return list(tokenizer(rendered, add_special_tokens=False, verbose=False)["input_ids"])


def instruct_completion(text: str) -> str:
    """``build_predictions_instruct``: the generated code up to the first closing fence (the
    stop strings already cut it, as lm-eval's ``until``)."""
    text = truncate_completion(text)
    fence = text.find("```")
    return text if fence == -1 else text[:fence]


def program(problem: dict[str, Any], completion: str) -> str:
    """The program a completion is judged by: prompt + completion, the tests, the check."""
    return (problem["prompt"] + completion + "\n\n" + problem["test"] + "\n\n"
            + f"check({problem['entry_point']})\n")


def _limits(cpu_seconds: int) -> None:  # runs in the child before exec
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_AS, (_MEMORY, _MEMORY))
    resource.setrlimit(resource.RLIMIT_FSIZE, (_FILE, _FILE))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


_RUNNER = """import sys
try:
    exec(compile({source!r}, "<humaneval>", "exec"), {{}})
except BaseException as exc:
    sys.stderr.write("failed: " + (type(exc).__name__ + ": " + str(exc)).strip() + "\\n")
    sys.stderr.flush()
    sys.exit(1)
sys.stdout.write("\\n{marker}")
sys.stdout.flush()
"""


def run_program(source: str, *, timeout: float = TIMEOUT) -> dict[str, Any]:
    """Run ``source`` in the sandbox (module docstring) as human-eval does (``exec`` with fresh
    globals); ``{"passed": exec returned, "result": "passed" | "timed out" | "failed: ..."}``."""
    marker = "humaneval-passed-" + secrets.token_hex(16)
    runner_source = _RUNNER.format(source=source, marker=marker)
    with tempfile.TemporaryDirectory(prefix="humaneval_") as cwd:
        try:
            done = subprocess.run([sys.executable, "-I", "-c", runner_source], cwd=cwd, env={},
                                  stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=timeout,
                                  preexec_fn=lambda: _limits(int(timeout) + 1))
        except subprocess.TimeoutExpired:
            return {"passed": False, "result": "timed out"}
    if done.returncode == 0 and done.stdout.endswith(marker.encode()):
        return {"passed": True, "result": "passed"}
    err = done.stderr.decode("utf-8", "replace").strip().splitlines()
    if err and err[-1].startswith("failed: "):
        return {"passed": False, "result": err[-1]}
    if done.returncode == 0:
        return {"passed": False, "result": "failed: exited before the tests finished"}
    return {"passed": False, "result": "failed: " + (err[-1] if err else
                                                     f"exit {done.returncode}")}


def run_humaneval(model: Any, tokenizer: Any, path: str, *, length: int, limit: int = 0,
                  timeout: float = TIMEOUT, progress: Any = None,
                  chat: bool = False) -> dict[str, Any]:
    """Greedy completions of every problem, executed; ``{"pass@1": 0-100, "samples": [...]}``.
    ``chat``: lm-eval's ``humaneval_instruct`` protocol (module docstring)."""
    problems = load_problems(path, limit)
    pad, eos = runner.pad_id(tokenizer), runner.model_eos_ids(model, tokenizer)
    if progress is not None:
        progress.total = (progress.total or 0) + len(problems)
        progress.set_description("humaneval")
    recs = []
    for p in problems:
        ids = (instruct_ids(tokenizer, p) if chat else
               tokenizer(p["prompt"], add_special_tokens=True, verbose=False)["input_ids"])
        budget = min(MAX_GEN_TOKS, length - len(ids))
        if budget < 1:
            raise UserError(f"--lengths {length}: HumanEval {p['task_id']} has a "
                            f"{len(ids)}-token prompt; use a longer length")
        out = runner.greedy_generate(model, [ids], max_new_tokens=budget, pad_id=pad,
                                     eos_ids=eos, stop_strings=STOP, tokenizer=tokenizer)[0]
        text = tokenizer.decode(out, skip_special_tokens=True)
        completion = instruct_completion(text) if chat else truncate_completion(text)
        res = run_program(program(p, completion), timeout=timeout)
        recs.append({"task_id": p["task_id"], "completion": completion,
                     "generated_tokens": len(out), **res})
        if progress is not None:
            progress.update(1)
    passed = sum(r["passed"] for r in recs)
    return {"pass@1": round(100 * passed / len(recs), 2), "passed": passed,
            "problems": len(recs), "samples": recs, "timeout_s": timeout,
            "protocol": "lm-eval humaneval_instruct (chat)" if chat else "lm-eval humaneval",
            "sandbox": "python -I, empty env, empty temp cwd, wall timeout "
                       f"{timeout:g}s, RLIMIT_CPU/AS(2 GiB)/FSIZE(16 MiB)/CORE; same user, "
                       "network NOT blocked"}
