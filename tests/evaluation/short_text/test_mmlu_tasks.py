"""MMLU as lm-eval's MMLU (the real lm-eval 0.4.13 builds the prompts from our local task
files): each question's prompt starts with its subject's description line and its five shots
are the first five dev questions of the same subject, in file order, whatever other subjects'
lines come between them."""

from __future__ import annotations

import json

import pytest

from megatron_endprompt.evaluation.short_text import mmlu as mmlu_tasks


def _q(subject: str, i: int, answer: int = 0) -> dict:
    return {"question": f"{subject} question {i}?", "subject": subject,
            "choices": [f"{subject}-{i}-{c}" for c in "abcd"], "answer": answer}


@pytest.fixture
def mmlu_dir(tmp_path):
    root = tmp_path / "st"
    root.mkdir()
    dev = [_q(s, i, i % 4) for i in range(7) for s in ("abstract_algebra", "college_biology")]
    test = [_q("college_biology", 100), _q("abstract_algebra", 200)]
    (root / "mmlu_dev.jsonl").write_text("".join(json.dumps(d) + "\n" for d in dev))
    (root / "mmlu_test.jsonl").write_text("".join(json.dumps(d) + "\n" for d in test))
    return root


def _contexts(include_dir, tasks):
    from lm_eval.tasks import TaskManager, get_task_dict

    tm = TaskManager(include_path=str(include_dir), include_defaults=False)  # as the run does
    out = {}
    for name, task in get_task_dict(list(tasks), tm).items():
        task = task if hasattr(task, "build_all_requests") else None
        if task is None:
            continue
        task.build_all_requests(limit=None, rank=0, world_size=1)
        out[name] = task.instances[0].args[0]
    return out


def test_prompt_has_subject_line_and_same_subject_shots(mmlu_dir, tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    made = mmlu_tasks.write_mmlu_tasks(str(mmlu_dir), str(inc))
    assert made["shots"] == {"abstract_algebra": 5, "college_biology": 5}
    bio = made["subjects"]["college_biology"]
    ctx = _contexts(inc, [bio])[bio]
    assert ctx.startswith("The following are multiple choice questions (with answers) about "
                          "college biology.\n\n")
    shots = [f"college_biology question {i}?\nA. college_biology-{i}-a\nB. college_biology-"
             f"{i}-b\nC. college_biology-{i}-c\nD. college_biology-{i}-d\nAnswer: "
             f"{'ABCD'[i % 4]}" for i in range(5)]
    question = ("college_biology question 100?\nA. college_biology-100-a\nB. "
                "college_biology-100-b\nC. college_biology-100-c\nD. college_biology-100-d\n"
                "Answer:")
    assert ctx == mmlu_tasks.description("college_biology") + "\n\n".join(shots) + "\n\n" \
        + question
    assert "abstract_algebra" not in ctx


def test_group_aggregates_as_lm_eval(mmlu_dir, tmp_path):
    """The group averages acc weighted by size, as lm-eval's mmlu groups."""
    inc = tmp_path / "inc"
    inc.mkdir()
    mmlu_tasks.write_mmlu_tasks(str(mmlu_dir), str(inc))
    group = json.loads((inc / f"{mmlu_tasks.GROUP}.yaml").read_text())
    assert group["aggregate_metric_list"] == [{"metric": "acc", "weight_by_size": True}]
    assert len(group["task"]) == 2
