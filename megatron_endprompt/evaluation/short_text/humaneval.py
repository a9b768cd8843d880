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
from megatron_endprompt.evaluation.core.chat import chat_ids
from megatron_endprompt.evaluation.core.local_jsonl import read_items

__all__ = ["STOP", "TIMEOUT", "load_problems", "truncate_completion", "program", "run_program",
           "run_humaneval"]

STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
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
    ``chat``: the prompt goes in as one user turn of the chat template (``chat.chat_ids``)."""
    problems = load_problems(path, limit)
    pad, eos = runner.pad_id(tokenizer), runner.model_eos_ids(model, tokenizer)
    if progress is not None:
        progress.total = (progress.total or 0) + len(problems)
        progress.set_description("humaneval")
    recs = []
    for p in problems:
        ids = (chat_ids(tokenizer, p["prompt"]) if chat else
               tokenizer(p["prompt"], add_special_tokens=True, verbose=False)["input_ids"])
        budget = min(MAX_GEN_TOKS, length - len(ids))
        if budget < 1:
            raise UserError(f"--lengths {length}: HumanEval {p['task_id']} has a "
                            f"{len(ids)}-token prompt; use a longer length")
        out = runner.greedy_generate(model, [ids], max_new_tokens=budget, pad_id=pad,
                                     eos_ids=eos, stop_strings=STOP, tokenizer=tokenizer)[0]
        completion = truncate_completion(tokenizer.decode(out, skip_special_tokens=True))
        res = run_program(program(p, completion), timeout=timeout)
        recs.append({"task_id": p["task_id"], "completion": completion,
                     "generated_tokens": len(out), **res})
        if progress is not None:
            progress.update(1)
    passed = sum(r["passed"] for r in recs)
    return {"pass@1": round(100 * passed / len(recs), 2), "passed": passed,
            "problems": len(recs), "samples": recs, "timeout_s": timeout,
            "sandbox": "python -I, empty env, empty temp cwd, wall timeout "
                       f"{timeout:g}s, RLIMIT_CPU/AS(2 GiB)/FSIZE(16 MiB)/CORE; same user, "
                       "network NOT blocked"}
