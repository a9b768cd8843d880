"""MMLU as lm-eval's MMLU, from local files: one lm-eval task per subject and a group over them.

lm-eval 0.4.13's ``mmlu`` (``lm_eval/tasks/mmlu/default``) is 57 per-subject tasks: each
includes ``_default_template_yaml`` (prompt ``{{question.strip()}}\\nA. ...\\nD. ...\\nAnswer:``,
choices ``A``-``D``, target ``answer``, ``acc``, few-shot split ``dev`` with the ``first_n``
sampler, so the shots are the first five dev questions *of that subject*) and a description
written by ``_generate_configs.py``: ``"The following are multiple choice questions (with
answers) about {' '.join(subject.split('_'))}.\\n\\n"``. The groups ``mmlu_stem`` ... and
``mmlu`` aggregate ``acc`` with ``weight_by_size: True`` at both levels, which is the mean over
every question; one group over the subjects with ``weight_by_size`` gives that same number.

Here ``mmlu_test.jsonl`` (and ``mmlu_dev.jsonl`` for the shots) hold every subject, one object
per line (``question``, ``subject``, ``choices`` [4], ``answer`` 0-3). We check every line
(one ``error:`` line naming the file and line, instead of a ``datasets`` traceback inside
lm-eval), split the lines by subject into files beside the task YAMLs, and write one task per
subject (``endprompt_mmlu_<n>``, alias = the subject) with lm-eval's fields and description,
plus the group ``endprompt_mmlu``. A subject with fewer than five dev questions gets as many
shots as it has (recorded per subject).
"""

from __future__ import annotations

import json
import os
from typing import Any

from megatron_endprompt.evaluation.core.local_jsonl import read_items

__all__ = ["MMLU_TEMPLATE", "MMLU_SHOTS", "GROUP", "description", "load_mmlu",
           "write_mmlu_tasks"]

#: lm-eval 0.4.13 ``mmlu/default/_default_template_yaml`` (less the hub dataset fields).
MMLU_TEMPLATE: dict[str, Any] = {
    "output_type": "multiple_choice", "test_split": "test", "fewshot_split": "dev",
    "fewshot_config": {"sampler": "first_n"},
    "doc_to_text": "{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nC. "
                   "{{choices[2]}}\nD. {{choices[3]}}\nAnswer:",
    "doc_to_choice": ["A", "B", "C", "D"], "doc_to_target": "answer",
    "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
}
#: lm-eval's MMLU shot count (``num_fewshot`` 5, the MMLU paper's).
MMLU_SHOTS = 5
GROUP = "endprompt_mmlu"
_FIELDS = ("question", "subject", "choices", "answer")


def description(subject: str) -> str:
    """lm-eval's ``_generate_configs.py`` description of ``subject`` (e.g.
    ``abstract_algebra``)."""
    return ("The following are multiple choice questions (with answers) about "
            f"{' '.join(subject.split('_'))}.\n\n")


def _check(item: dict[str, Any]) -> str | None:
    if not isinstance(item["subject"], str) or not item["subject"]:
        return "subject (a non-empty string)"
    if not isinstance(item["choices"], list) or len(item["choices"]) != 4:
        return "choices (a list of 4)"
    if not isinstance(item["answer"], int) or not 0 <= item["answer"] <= 3:
        return "answer (an integer 0-3)"
    return None


def _by_subject(path: str) -> dict[str, list[dict[str, Any]]]:
    items = read_items(path, fields=_FIELDS, flag="--short-text-dir", benchmark="MMLU",
                       noun="question", extra_check=_check)
    out: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        out.setdefault(item["subject"], []).append(item)
    return out


def load_mmlu(root: str) -> tuple[dict[str, list[dict[str, Any]]],
                                  dict[str, list[dict[str, Any]]]]:
    """``(test, dev)`` questions of ``root`` by subject, every line checked (``dev`` empty
    without ``mmlu_dev.jsonl``). Raises ``UserError`` naming the file and line."""
    dev_path = os.path.join(root, "mmlu_dev.jsonl")
    return (_by_subject(os.path.join(root, "mmlu_test.jsonl")),
            _by_subject(dev_path) if os.path.isfile(dev_path) else {})


def _write_jsonl(path: str, items: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item) + "\n")


def write_mmlu_tasks(root: str, include_dir: str) -> dict[str, Any]:
    """Write the per-subject tasks and the group of ``root``'s MMLU files into
    ``include_dir``; returns ``{"group", "subjects": {subject: task}, "shots": {subject: n}}``.
    Raises ``UserError`` (file and line) for a malformed line."""
    test, dev = load_mmlu(root)
    subjects: dict[str, str] = {}
    shots: dict[str, int] = {}
    for n, subject in enumerate(sorted(test)):
        task = f"{GROUP}_{n:03d}"
        files = {"test": os.path.join(include_dir, f"{task}_test.jsonl")}
        _write_jsonl(files["test"], test[subject])
        shots[subject] = min(MMLU_SHOTS, len(dev.get(subject, [])))
        body = dict(MMLU_TEMPLATE)
        if shots[subject]:
            files["dev"] = os.path.join(include_dir, f"{task}_dev.jsonl")
            _write_jsonl(files["dev"], dev[subject])
        else:
            body.pop("fewshot_split")
            body.pop("fewshot_config")
        spec = {"task": task, "task_alias": subject, "dataset_path": "json",
                "dataset_kwargs": {"data_files": files}, "description": description(subject),
                "num_fewshot": shots[subject], **body, "metadata": {"version": 1.0}}
        with open(os.path.join(include_dir, f"{task}.yaml"), "w", encoding="utf-8") as f:
            f.write(json.dumps(spec, indent=1))  # JSON is YAML
        subjects[subject] = task
    group = {"group": GROUP, "task": list(subjects.values()),
             "aggregate_metric_list": [{"metric": "acc", "weight_by_size": True}],
             "metadata": {"version": 2}}
    with open(os.path.join(include_dir, f"{GROUP}.yaml"), "w", encoding="utf-8") as f:
        f.write(json.dumps(group, indent=1))
    return {"group": GROUP, "subjects": subjects, "shots": shots}
