"""The task table is the one place a generation task is declared: a new task (its builder,
scorer, length rule and resource, written here as its module would be) registered as one row
runs through the CLI and the pipeline unchanged, and is gone once the row is removed."""

from __future__ import annotations

import json

import pytest

from megatron_endprompt.cli import eval as eval_cli
from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation import task_table
from megatron_endprompt.evaluation.core.prompt import PromptSample
from megatron_endprompt.evaluation.core.task import GenerationTask, Resource, TaskContext

# --- the example task's module: repeat a word list back -------------------------------------

WORDS = ("apple", "river", "stone", "cloud")
MAX_NEW = 8
seen: dict[str, list] = {"loads": [], "checks": [], "scored": []}


def _load_words(ctx: TaskContext, tasks: tuple[str, ...]) -> tuple[str, ...]:
    seen["loads"].append(tasks)
    return WORDS


WORD_FILE = Resource(name="example_words", load=_load_words)


def _build(ctx: TaskContext, name: str, length: int) -> list[PromptSample]:
    words = ctx.resources[WORD_FILE.name]
    out = []
    for i in range(ctx.cfg.samples or 0):
        text = f"Repeat the word: {words[i % len(words)]}. The word is"
        ids = ctx.tokens.array(text)
        out.append(PromptSample(task=name, length=length, index=i, input_ids=ids,
                                answers=(words[i % len(words)],), metric="example_match",
                                max_new_tokens=MAX_NEW, prompt=text))
    return out


def _fits(ctx: TaskContext, name: str, length: int) -> None:
    seen["checks"].append(length)
    if length < 64:
        raise ValueError(f"{name}: length {length} is below 64 tokens")


def _score(prediction: str, references) -> float:
    seen["scored"].append(prediction)
    return 1.0 if references[0] in prediction else 0.25  # 0.25: this scorer ran, not another


ROW = GenerationTask(name="example_repeat", build=_build, scorer=_score, check_length=_fits,
                     resources=(WORD_FILE,))

# --------------------------------------------------------------------------------------------


@pytest.fixture
def with_row(monkeypatch):
    """The example row in the table for one test (removed again by monkeypatch)."""
    for key in seen:
        seen[key].clear()
    monkeypatch.setitem(task_table.TASKS, ROW.name, ROW)
    yield ROW


def test_new_task_is_one_row(with_row, tiny_model_dir, tmp_path, run_tool):
    out = tmp_path / "r.json"
    rc, _, err = run_tool(eval_cli.main, [
        "--hf-dir", tiny_model_dir, "--tasks", f"{ROW.name},passkey", "--lengths", "256,512",
        "--samples", "2", "--num-depths", "1", "--device", "cpu", "--output", str(out),
        "--no-progress"])
    assert rc == 0, err
    results = json.loads(out.read_text())
    assert list(results["tasks"]) == [ROW.name, "passkey"]
    task = results["tasks"][ROW.name]
    assert set(task["scores"]) == {"256", "512"} and len(task["samples"]) == 4
    assert all(s["score"] in (0.25, 1.0) for s in task["samples"])  # our scorer, every sample
    assert seen["loads"] == [(ROW.name,)]  # the resource: loaded once for the run
    assert seen["checks"] == [256, 512] and len(seen["scored"]) == 4
    assert f"| {ROW.name} |" in out.with_suffix(".md").read_text()
    assert ROW.name in eval_cli.build_parser().format_help()  # --help lists the table's rows


def test_length_rule_runs_before_the_model(with_row, tiny_model_dir, tmp_path, run_tool,
                                           monkeypatch):
    from megatron_endprompt.evaluation.core import runner

    monkeypatch.setattr(runner, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    rc, _, err = run_tool(eval_cli.main, [
        "--hf-dir", tiny_model_dir, "--tasks", ROW.name, "--lengths", "32", "--device", "cpu",
        "--output", str(tmp_path / "r.json"), "--no-progress"])
    assert rc == 2
    assert err.strip().splitlines() == [
        f"error: --lengths 32: {ROW.name}: length 32 is below 64 tokens"]
    assert not (tmp_path / "r.json").exists()


def test_row_removed_is_unknown():
    assert ROW.name not in task_table.TASKS
    with pytest.raises(UserError, match=f"unknown task '{ROW.name}'"):
        task_table.resolve_tasks(ROW.name)
