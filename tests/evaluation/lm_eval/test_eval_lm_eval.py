"""``--backend lm-eval`` with the real lm-evaluation-harness (0.4.13, ``lm-eval[hf,ruler]``) on
the random tiny Llama: a local custom task (``dataset_path: json`` over a JSONL fixture, found
through ``--lm-eval-include``) and lm-eval's offline RULER ``niah_single_1`` at two lengths;
and the one-line refusals (unknown task, a hub dataset offline, a task without metrics), each
before any output exists. lm-eval's index build costs ~8 s per run on 2 cores, so the cases
are few."""

from __future__ import annotations

import json
import os

import pytest

from megatron_endprompt.cli import eval as eval_cli

pytest.importorskip("lm_eval", reason="the lm-eval extra (lm-eval[hf,ruler]) is in "
                    "requirements-dev.txt")

QA = [{"question": f"What is {i} plus {i}?", "answer": str(2 * i)} for i in range(1, 4)]


def _task_dir(root, name: str, *, no_metric: bool = False) -> str:
    """A local lm-eval task ``name`` over a JSONL file of ``QA`` in ``root``; ``no_metric``: its
    ``process_results`` returns nothing (lm-eval then reports no metric)."""
    root.mkdir(exist_ok=True)
    data = root / f"{name}.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in QA), encoding="utf-8")
    extra = ""
    if no_metric:
        (root / f"{name}_utils.py").write_text(
            "def nothing(doc, results):\n    return {}\n", encoding="utf-8")
        extra = f"process_results: !function {name}_utils.nothing\n"
    (root / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\ntest_split: test\noutput_type: generate_until\n"
        "doc_to_text: \"Question: {{question}}\\nAnswer:\"\ndoc_to_target: \"{{answer}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 4\n  do_sample: false\n"
        + extra +
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n"
        "    higher_is_better: true\nmetadata:\n  version: 1.0\n", encoding="utf-8")
    return str(root)


@pytest.mark.slow  # in process, but lm-eval's index and a generation run: not the fast tier
def test_custom_task_and_ruler_lengths(tiny_model_dir, tmp_path, run_tool):
    """The issue's run: a local task's metric (with stderr) and niah_single_1 at both lengths
    from --samples 2 per length (old code: the custom task dropped, ``limit=4`` all at 512)."""
    tasks = _task_dir(tmp_path / "tasks", "tiny_qa")
    out = tmp_path / "lm" / "r.json"
    rc, stdout, err = run_tool(eval_cli.main, [
        "--hf-dir", tiny_model_dir, "--backend", "lm-eval", "--lm-eval-include", tasks,
        "--tasks", "tiny_qa,niah_single_1", "--lengths", "512,640", "--samples", "2",
        "--device", "cpu", "--output", out, "--no-progress"])
    assert rc == 0, err
    res = json.loads(out.read_text())
    qa = res["tasks"]["tiny_qa"]
    assert set(qa["metrics"]) == {"exact_match"} and qa["samples"] == 2
    assert 0.0 <= qa["metrics"]["exact_match"]["value"] <= 1.0
    assert qa["metrics"]["exact_match"]["stderr"] is not None
    niah = res["tasks"]["niah_single_1"]
    assert set(niah["scores"]) == {"512", "640"} and niah["samples"] == 4
    assert all(0.0 <= v <= 100.0 for v in niah["scores"].values())
    assert "4096" not in niah["metrics"]  # lm-eval's -1 for a length not asked for
    assert set(res["ruler"]["average"]) == {"512", "640"}
    assert res["meta"]["lm_eval_version"].startswith("0.4")
    assert res["meta"]["lm_eval_seeds"] == {"random_seed": 0, "numpy_random_seed": 1234,
                                            "torch_random_seed": 1234, "fewshot_random_seed": 1234}
    md = (tmp_path / "lm" / "r.md").read_text()
    assert "| niah_single_1 (RULER) |" in md and "| tiny_qa | exact_match (0-100) |" in md
    assert "| tiny_qa | exact_match (0-100) |" in stdout


@pytest.mark.slow  # each case builds lm-eval's task index (~8 s on 2 quiet cores)
@pytest.mark.parametrize("case", ["unknown", "offline", "no_metric"])
def test_refusals_one_line_no_output(case, tiny_model_dir, tmp_path, run_tool, monkeypatch):
    """Old code: a KeyError traceback (a local task by name), a ConnectionError traceback
    (offline hub data), and exit 0 with ``"tasks": {}`` (no metric). Now one line each and
    no output."""
    import datasets
    import huggingface_hub

    # offline here and on machines with internet (read at call time, not only at import)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    argv = ["--hf-dir", tiny_model_dir, "--backend", "lm-eval", "--lengths", "512",
            "--samples", "1", "--device", "cpu", "--output", tmp_path / "o" / "r.json"]
    tasks, needle = {"unknown": ("tiny_qa", "--tasks tiny_qa: not an lm-eval task"),
                     "offline": ("arc_easy", "allenai/ai2_arc"),
                     "no_metric": ("nometric", "--tasks nometric: lm-eval ran the task but "
                                               "it yielded no metric")}[case]
    if case == "no_metric":
        argv += ["--lm-eval-include", _task_dir(tmp_path / "tasks", "nometric",
                                                no_metric=True)]
    rc, _, err = run_tool(eval_cli.main, [*argv, "--tasks", tasks])
    lines = [x for x in err.strip().splitlines() if x.startswith("error:")]
    assert rc == 2 and "Traceback" not in err and len(lines) == 1, err
    assert needle in lines[0], lines[0]
    if case == "offline":
        assert "--lm-eval-include" in lines[0]
    assert not os.path.exists(tmp_path / "o")  # no output, not even its directory


def test_document_picks_every_length():
    """``--samples 2`` with RULER's length blocks (500 per length, one block after another in
    lm-eval 0.4.13) takes 2 of each length; a length without documents is refused."""
    from megatron_endprompt.errors import UserError
    from megatron_endprompt.evaluation.lm_eval.tasks import pick_documents

    docs = [{"max_length": n} for n in (1024, 2048) for _ in range(5)]
    assert pick_documents(docs, samples=2, lengths=[1024, 2048], task="t") == [0, 1, 5, 6]
    assert pick_documents(docs, samples=None, lengths=[1024, 2048], task="t") is None
    assert pick_documents([{"q": 1}] * 3, samples=2, lengths=[1024], task="t") == [0, 1]
    with pytest.raises(UserError, match="--lengths 4096: lm-eval generated no t document"):
        pick_documents(docs, samples=2, lengths=[1024, 4096], task="t")
