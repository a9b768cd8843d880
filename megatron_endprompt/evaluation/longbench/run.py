"""LongBench (English tasks, six categories) from local files, natively.

lm-eval 0.4.13 has ``longbench_*`` tasks, but they read ``THUDM/LongBench`` from the hub (a
dataset script and zip download) and cannot be pointed at local files; this module runs
LongBench's own protocol on local JSONL files instead. ``--longbench-dir DIR`` holds LongBench's
``data/`` files, ``DIR/{task}.jsonl``, one object per line with LongBench's fields ``input``,
``context``, ``answers``, ``length``, ``dataset``, ``all_classes``, ``_id``.

Protocol (LongBench ``pred.py``): prompt = ``dataset2prompt[task].format(**item)``; tokenized
with special tokens; when longer than ``max_length`` tokens, the middle is cut:
``decode(ids[:half]) + decode(ids[-half:])`` with ``half = max_length // 2``, special tokens
skipped, then re-tokenized. Greedy decoding of at most ``dataset2maxlen[task]`` tokens; for
samsum a newline also ends generation and at least one token is generated. No chat template
for base models; with ``chat=True`` (``--chat-template model``) the truncated prompt is wrapped
in the tokenizer's chat template except for LongBench's six unwrapped tasks (``chat``).
Scores: ``longbench_metrics.score_prediction`` x 100 averaged per task (LongBench
``scorer``: ``round(100 * mean, 2)``), then per category and over categories.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation.longbench import spec
from megatron_endprompt.evaluation.core.chat import chat_ids
from megatron_endprompt.evaluation.core.local_jsonl import read_items
from megatron_endprompt.evaluation.longbench.metrics import score_prediction
from megatron_endprompt.evaluation.core.runner import greedy_generate, model_eos_ids, pad_id

__all__ = ["load_task", "available_tasks", "build_prompt", "run_longbench", "summarize",
           "by_length_bucket"]

_FIELDS = ("input", "context", "answers", "all_classes")


def _file(task: str, e: bool) -> str:
    return f"{task}_e.jsonl" if e else f"{task}.jsonl"


def available_tasks(root: str, e: bool = False) -> list[str]:
    """English LongBench tasks with a ``{task}.jsonl`` in ``root`` (LongBench's order); with
    ``e``, LongBench-E's tasks with a ``{task}_e.jsonl``."""
    if not os.path.isdir(root):
        raise UserError(f"--longbench-dir {root}: no such directory; give LongBench's data/ "
                        "folder ({task}.jsonl files)")
    names = spec.E_TASKS if e else spec.TASKS
    found = [t for t in names if os.path.isfile(os.path.join(root, _file(t, e)))]
    if not found:
        raise UserError(f"--longbench-dir {root}: no LongBench{'-E' if e else ''} file "
                        f"({_file(names[0], e)}, ...); give LongBench's data/ folder")
    return found


def load_task(root: str, task: str, limit: int = 0, e: bool = False) -> list[dict[str, Any]]:
    """The items of ``root/{task}.jsonl`` (``{task}_e.jsonl`` with ``e``; the first ``limit``
    when > 0), fields checked."""
    path = os.path.join(root, _file(task, e))
    return read_items(path, fields=_FIELDS + (("length",) if e else ()),
                      flag="--longbench-dir", benchmark="LongBench", noun="item", limit=limit,
                      extra_check=lambda item: _check(item, e))


def _check(item: dict[str, Any], e: bool) -> str | None:
    if not isinstance(item["answers"], list):
        return "answers (a list)"
    if e and (isinstance(item["length"], bool) or not isinstance(item["length"], (int, float))):
        return "length (a number: LongBench-E's buckets)"
    return None


def build_prompt(task: str, item: dict[str, Any], tokenizer: Any,
                 max_length: int, *, chat: bool = False) -> list[int]:
    """Input ids of one item: LongBench's template, middle-truncated to ``max_length`` tokens
    (``pred.py``), then, with ``chat``, wrapped in the chat template unless ``task`` is one of
    LongBench's unwrapped six. Returns a list of ids (BOS first where the tokenizer adds
    one)."""
    prompt = spec.prompt_template(task).format(**item)
    ids = tokenizer(prompt, add_special_tokens=True, verbose=False)["input_ids"]
    if len(ids) > max_length:
        half = int(max_length / 2)
        prompt = (tokenizer.decode(ids[:half], skip_special_tokens=True)
                  + tokenizer.decode(ids[-half:], skip_special_tokens=True))
        ids = tokenizer(prompt, add_special_tokens=True, verbose=False)["input_ids"]
    if chat and task not in spec.NO_CHAT_TASKS:
        return chat_ids(tokenizer, prompt)
    return list(ids)


def run_longbench(model: Any, tokenizer: Any, root: str, *, length: int, limit: int = 0,
                  batch_size: int = 1, progress: Any = None,
                  chat: bool = False, e: bool = False) -> dict[str, Any]:
    """Every English task found in ``root`` at context ``length`` (prompts cut to
    ``length - 500`` tokens, LongBench's ``model2maxlen`` margin); returns :func:`summarize`'s
    dict with the per-sample predictions under ``samples``."""
    max_length = length - spec.TRUNCATION_MARGIN
    if max_length < 16:
        raise UserError(f"--lengths: LongBench cuts prompts to length - "
                        f"{spec.TRUNCATION_MARGIN} tokens; {length} leaves {max_length}; "
                        "use a length >= 1024")
    tasks = available_tasks(root, e)
    pad, eos = pad_id(tokenizer), model_eos_ids(model, tokenizer)
    newline = tokenizer.encode("\n", add_special_tokens=False)[-1:]
    per_task: dict[str, list[dict[str, Any]]] = {}
    for task in tasks:
        items = load_task(root, task, limit, e)
        if progress is not None:
            progress.total = (progress.total or 0) + len(items)
            progress.set_description(f"longbench {task}")
        budget = spec.max_new_tokens(task)
        stop = eos + newline if task == "samsum" else eos
        recs = []
        for b in range(0, len(items), batch_size):
            batch = items[b:b + batch_size]
            prompts = [build_prompt(task, it, tokenizer, max_length, chat=chat)
                       for it in batch]
            outs = greedy_generate(model, prompts, max_new_tokens=budget, pad_id=pad,
                                   eos_ids=stop, min_new_tokens=1 if task == "samsum" else 0)
            for it, ids, out in zip(batch, prompts, outs, strict=True):
                pred = tokenizer.decode(out, skip_special_tokens=True)
                recs.append({"_id": it.get("_id"), "length": it.get("length"),
                             "prompt_tokens": len(ids), "answers": it["answers"],
                             "output": pred,
                             "score": score_prediction(task, pred, it["answers"],
                                                       it.get("all_classes"))})
            if progress is not None:
                progress.update(len(batch))
        per_task[task] = recs
    out = summarize({t: [r["score"] for r in rs] for t, rs in per_task.items()})
    out["items"] = {t: len(rs) for t, rs in per_task.items()}
    if e:
        out["missing"] = [t for t in spec.E_TASKS if t not in per_task]
        out["complete"] = not out["missing"]
        out["buckets"] = {t: by_length_bucket(rs) for t, rs in per_task.items()}
    out.update({"e": e, "dir": root, "length": length, "max_prompt_tokens": max_length,
                "chat_template": "model" if chat else "none", "samples": per_task})
    return out


def by_length_bucket(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """LongBench ``scorer_e``: ``round(100 * mean, 2)`` of the scores per bucket of the items'
    ``length`` field; a bucket without items is ``None`` (LongBench: NaN)."""
    out: dict[str, float | None] = {}
    lower = float("-inf")
    for name, upper in spec.E_BUCKETS:
        vals = [r["score"] for r in records if lower <= float(r["length"]) < upper]
        out[name] = round(100 * sum(vals) / len(vals), 2) if vals else None
        lower = upper
    return out


def _mean(vals: Sequence[float]) -> float | None:
    return sum(vals) / len(vals) if vals else None


def summarize(scores: dict[str, Sequence[float]]) -> dict[str, Any]:
    """Per-prediction scores (0-1) per task -> ``{"tasks": {task: 0-100}, "categories":
    {category: mean of its tasks run}, "average": mean over the categories run, "missing":
    tasks not run, "complete": every English task ran}``. A category none of whose tasks ran
    is ``None`` and is not averaged."""
    tasks = {t: round(100 * sum(v) / len(v), 2) for t, v in scores.items() if v}
    cats: dict[str, float | None] = {}
    for cat, members in spec.CATEGORIES.items():
        m = _mean([tasks[t] for t in members if t in tasks])
        cats[cat] = None if m is None else round(m, 2)
    have = [v for v in cats.values() if v is not None]
    missing = [t for t in spec.TASKS if t not in tasks]
    avg = _mean(have)
    return {"tasks": tasks, "categories": cats,
            "average": None if avg is None else round(avg, 2), "missing": missing,
            "complete": not missing, "skipped_chinese": list(spec.CHINESE_TASKS)}
