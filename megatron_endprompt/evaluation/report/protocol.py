"""When a run's number may stand beside the EndPrompt paper's: the paper's protocol per table and
the gate that lists every way a run departs from it.

A paper average is printed as comparable only when the run measured the same thing; otherwise
the report prints ``not comparable: <every reason>``. The protocol facts:

- RULER (the 4K-64K average): RULER's 13 tasks (``scripts/config_tasks.sh``: 11 synthetic +
  qa_1, qa_2) at 4K, 8K, 16K, 32K and 64K, RULER's own haystack (Paul Graham essays for the essay
  tasks, not our public-domain substitute), RULER's sample count (``NUM_SAMPLES=500`` per task x
  length, ``scripts/config_tasks.sh``). RULER prompts never get a chat template here (RULER's
  ``base`` model template, as for the paper's base models).
- LongBench: every English task, every item (no ``--bench-limit``), the context the paper's
  models were evaluated at (:data:`LONGBENCH_CONTEXT`: the 64K window the paper extends to; a
  shorter context truncates more of each prompt), and LongBench's chat rule (``pred.py``: a chat
  model's prompt is wrapped in its chat template): a tokenizer that ships a chat template must be
  run with ``--chat-template model``.
- Short text: all four benchmarks, every item, lm-eval's shot counts (MMLU 5, GSM8K 5,
  HellaSwag 0; HumanEval 0), and the same chat rule. The paper's short-text numbers are of
  models after an SFT phase.

``results`` is the evaluation's results dict (``suite.run_eval``): ``meta`` records
``samples``, ``bench_limit``, ``chat_template`` (``none``/``model``) and
``tokenizer_chat_template`` (whether the tokenizer ships one).
"""

from __future__ import annotations

from typing import Any

from megatron_endprompt.evaluation.longbench.spec import E_SIZES as LONGBENCH_E_SIZES
from megatron_endprompt.evaluation.longbench.spec import SIZES as LONGBENCH_SIZES
from megatron_endprompt.evaluation.ruler.spec import ESSAY_TASKS
from megatron_endprompt.evaluation.short_text.spec import SIZES as SHORT_TEXT_SIZES

__all__ = ["RULER_SAMPLES", "LONGBENCH_CONTEXT", "SHORT_TEXT_SHOTS", "ruler_reasons",
           "longbench_reasons", "short_text_reasons"]

#: RULER ``scripts/config_tasks.sh``: ``NUM_SAMPLES=500`` per task x length.
RULER_SAMPLES = 500
#: The paper's target window (LLaMA-family models extended from 8K to 64K).
LONGBENCH_CONTEXT = 65536
#: lm-eval 0.4.13's default shots (mmlu, gsm8k, hellaswag) and HumanEval's zero-shot.
SHORT_TEXT_SHOTS = {"mmlu": 5, "gsm8k": 5, "hellaswag": 0, "humaneval": 0}


def _chat_reasons(meta: dict[str, Any]) -> list[str]:
    mode = meta.get("chat_template", "none")
    if meta.get("tokenizer_chat_template") and mode != "model":
        return ["the tokenizer ships a chat template (an instruct/chat model) and the run did "
                "not apply it (--chat-template model)"]
    if mode == "model" and not meta.get("tokenizer_chat_template"):
        return ["--chat-template model on a tokenizer without a chat template"]
    return []


def _limit_reason(meta: dict[str, Any], what: str) -> list[str]:
    limit = meta.get("bench_limit") or 0
    return [f"--bench-limit {limit}: {what} run on the first {limit} item(s) only, not all"] \
        if limit else []


def ruler_reasons(results: dict[str, Any], average: dict[str, Any]) -> list[str]:
    """Every departure of a RULER run from the paper's 4K-64K protocol (``average`` is
    ``paper_report.ruler_paper_average``'s dict); empty when comparable."""
    meta = results.get("meta", {})
    tasks = results.get("tasks", {})
    out = []
    if average["missing_tasks"]:
        out.append(f"missing tasks {', '.join(average['missing_tasks'])} (RULER's 13)")
    if average["missing_lengths"]:
        out.append("missing lengths " + ", ".join(map(str, average["missing_lengths"]))
                   + " (4K-64K)")
    substitute = [t for t in tasks if t in ESSAY_TASKS and not tasks[t].get("exact_ruler")]
    if substitute:
        out.append(f"{', '.join(substitute)} on a substitute haystack, not RULER's Paul "
                   "Graham essays (--haystack PaulGrahamEssays.json)")
    samples = meta.get("samples")
    if samples != RULER_SAMPLES:
        out.append(f"{samples if samples else 'all lm-eval'} sample(s) per task x length "
                   f"(RULER: {RULER_SAMPLES}, --samples {RULER_SAMPLES})")
    else:
        short = [f"{t}@{n} {k}" for t, e in tasks.items() for n, k in
                 (e.get("items") or {}).items() if k < RULER_SAMPLES]
        if short:
            out.append(f"fewer than RULER's {RULER_SAMPLES} items in "
                       + ", ".join(short[:6]) + (" ..." if len(short) > 6 else ""))
    return out


def _short_items(items: dict[str, int], sizes: dict[str, int], what: str) -> list[str]:
    """A reason when any of ``items`` (run) falls short of ``sizes`` (the benchmark's)."""
    short = [f"{name} {n} of {sizes[name]}" for name, n in items.items()
             if name in sizes and n < sizes[name]]
    return [f"fewer items than {what} ({', '.join(short)}): a truncated data file or "
            "--bench-limit"] if short else []


def longbench_reasons(results: dict[str, Any]) -> list[str]:
    """Every departure of the LongBench run from the paper's protocol; empty when
    comparable."""
    lb, meta = results["longbench"], results.get("meta", {})
    out = []
    if lb.get("e"):
        out.append("LongBench-E (--longbench-e), not LongBench")
    if lb.get("missing"):
        out.append(f"missing tasks {', '.join(lb['missing'])}")
    out += _limit_reason(meta, "each task")
    out += _short_items(lb.get("items", {}),
                        LONGBENCH_E_SIZES if lb.get("e") else LONGBENCH_SIZES,
                        "LongBench-E's" if lb.get("e") else "LongBench's")
    if lb["length"] < LONGBENCH_CONTEXT:
        out.append(f"context {lb['length']} tokens (prompts cut to {lb['max_prompt_tokens']}), "
                   f"not the paper's {LONGBENCH_CONTEXT}")
    return out + _chat_reasons(meta)


def short_text_reasons(results: dict[str, Any]) -> list[str]:
    """Every departure of the short-text run from the paper's protocol; empty when
    comparable."""
    st, meta = results["short_text"], results.get("meta", {})
    out = []
    if st.get("missing"):
        out.append(f"missing {', '.join(st['missing'])}")
    out += _limit_reason(meta, "each benchmark")
    out += _short_items({b: e["items"] for b, e in st["benchmarks"].items() if "items" in e},
                        SHORT_TEXT_SIZES, "the benchmarks'")
    for bench, entry in st["benchmarks"].items():
        want = SHORT_TEXT_SHOTS[bench]
        if entry.get("num_fewshot") != want:
            out.append(f"{bench} {entry.get('num_fewshot')}-shot (lm-eval: {want}-shot)")
    return out + _chat_reasons(meta)
