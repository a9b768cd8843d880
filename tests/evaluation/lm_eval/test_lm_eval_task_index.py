"""Which lm-eval tasks ``--backend lm-eval`` indexes (the real lm-eval 0.4.13): when every
asked-for task is a leaf task of ``--lm-eval-include``, lm-eval's own ~10k task files are not
indexed (~10 s a run); a group of the include path may name a built-in task, so then the
built-ins are indexed too and the group still resolves."""

from __future__ import annotations

import pytest

from megatron_endprompt.evaluation.core.config import EvalConfig
from megatron_endprompt.evaluation.lm_eval import tasks as lm_eval_tasks
from test_eval_lm_eval import _task_dir


def _manager(tmp_path, include: str, asked: list[str]):
    cfg = EvalConfig(hf_dir=str(tmp_path / "model"), output=str(tmp_path / "r.json"),
                     lengths=[512], tasks=asked, backend="lm-eval", lm_eval_include=[include])
    return lm_eval_tasks._task_manager(cfg)


@pytest.mark.slow  # lm-eval's full index once (~10 s)
def test_only_a_group_brings_in_lm_evals_own_tasks(tmp_path):
    include = _task_dir(tmp_path / "tasks", "tiny_qa")
    (tmp_path / "tasks" / "mixed.yaml").write_text(
        "group: mixed\ntask:\n  - tiny_qa\n  - arc_easy\nmetadata:\n  version: 1.0\n",
        encoding="utf-8")
    leaf = _manager(tmp_path, include, ["tiny_qa"])
    assert "tiny_qa" in leaf.all_subtasks and "arc_easy" not in leaf.all_tasks
    group = _manager(tmp_path, include, ["mixed"])
    assert {"tiny_qa", "mixed", "arc_easy"} <= set(group.all_tasks)
