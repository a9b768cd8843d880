"""The evaluator never writes over its inputs, and never writes what it was not asked to: an
``--output`` (or its ``.md``/``.png`` siblings) or ``--save-prompts`` that is, contains or lies
inside an input or each other, an ``--output`` naming no file, and every size flag past its
bound are one ``error:`` line (exit 2) before the tokenizer or the model loads, nothing
written, every input byte-identical."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from megatron_endprompt.cli import eval as eval_cli
from megatron_endprompt.evaluation.core import runner
from tests.evaluation.tiny_tokenizers import FIXTURES


@pytest.fixture
def nothing_loads(monkeypatch):
    """The refusal must come before anything is opened: loading fails the test."""
    monkeypatch.setattr(runner, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    monkeypatch.setattr(runner, "load_tokenizer", lambda *a, **k: pytest.fail("tokenizer loaded"))


@pytest.fixture
def inputs(tiny_model_dir, tmp_path):
    """Every kind of input in ``tmp_path/in``: a model, PPL data, a haystack, LongBench,
    short-text and RULER QA folders, an lm-eval task folder."""
    root = tmp_path / "in"
    shutil.copytree(tiny_model_dir, root / "model")
    (root / "ppl.jsonl").write_text('{"text": "a b c"}\n')
    (root / "essays.txt").write_text("An essay. Another sentence.\n")
    shutil.copytree(os.path.join(FIXTURES, "longbench"), root / "longbench")
    shutil.copytree(os.path.join(FIXTURES, "short_text"), root / "short_text")
    shutil.copytree(os.path.join(FIXTURES, "ruler_qa"), root / "qa")
    (root / "tasks").mkdir()
    (root / "tasks" / "t.yaml").write_text("task: t\n")
    return root


def _tree(root) -> dict[str, str]:
    """Every path under ``root`` -> its content's sha256 (directories: "dir")."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in files:
            with open(os.path.join(dirpath, f), "rb") as fh:
                out[os.path.relpath(os.path.join(dirpath, f), root)] = hashlib.sha256(
                    fh.read()).hexdigest()
    return out


def _refused(run_tool, tmp_path, argv, *needles):
    before = _tree(tmp_path)
    rc, out, err = run_tool(eval_cli.main, argv)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert _tree(tmp_path) == before  # nothing written, every input intact


def _base(inputs, *extra):
    return ["--hf-dir", inputs / "model", "--lengths", "1024", "--device", "cpu",
            "--no-progress", *extra]


@pytest.mark.parametrize("flag, target, task_flags, needle", [
    ("--save-prompts", "ppl.jsonl", ["--tasks", "ppl", "--ppl-data", "{in}/ppl.jsonl"],
     "is the input --ppl-data"),
    ("--save-prompts", "essays.txt", ["--tasks", "niah_single_2", "--haystack",
                                      "{in}/essays.txt"], "is the input --haystack"),
    ("--save-prompts", "model/tokenizer.json", ["--tasks", "passkey"],
     "lies inside the input --hf-dir"),
    ("--save-prompts", "longbench/trec.jsonl", ["--tasks", "none", "--longbench-dir",
                                                "{in}/longbench"],
     "lies inside the input --longbench-dir"),
    ("--output", "model/config.json", ["--tasks", "passkey"], "lies inside the input --hf-dir"),
    ("--output", "short_text/r.json", ["--tasks", "none", "--short-text-dir",
                                       "{in}/short_text"],
     "lies inside the input --short-text-dir"),
    ("--output", "qa/r.json", ["--tasks", "qa_1", "--qa-dir", "{in}/qa"],
     "lies inside the input --qa-dir"),
    ("--output", "ppl.json", ["--tasks", "ppl", "--ppl-data", "{in}/ppl.md"],
     "ppl.md is the input --ppl-data"),  # the .md sibling of --output is the input
])
def test_output_over_an_input(inputs, tmp_path, run_tool, nothing_loads, flag, target,
                              task_flags, needle):
    if target == "ppl.json":
        os.rename(inputs / "ppl.jsonl", inputs / "ppl.md")
    argv = _base(inputs, *(a.replace("{in}", str(inputs)) for a in task_flags))
    out = ["--output", tmp_path / "out" / "r.json"] if flag == "--save-prompts" else []
    _refused(run_tool, tmp_path, [*argv, *out, flag, inputs / target], needle)


def test_lm_eval_include_is_an_input(inputs, tmp_path, run_tool, nothing_loads):
    _refused(run_tool, tmp_path, _base(inputs, "--backend", "lm-eval", "--tasks", "t",
                                       "--lm-eval-include", inputs / "tasks", "--output",
                                       inputs / "tasks" / "r.json"),
             "lies inside the input --lm-eval-include")


@pytest.mark.parametrize("backend", ["native", "lm-eval"])
def test_save_prompts_is_the_output(inputs, tmp_path, run_tool, nothing_loads, backend):
    out = tmp_path / "out" / "r.json"
    tasks = "passkey" if backend == "native" else "niah_single_1"
    _refused(run_tool, tmp_path, _base(inputs, "--backend", backend, "--tasks", tasks,
                                       "--output", out, "--save-prompts", out),
             f"--output {out} is --save-prompts {out}")


def test_save_prompts_is_the_markdown(inputs, tmp_path, run_tool, nothing_loads):
    out = tmp_path / "out" / "r.json"
    _refused(run_tool, tmp_path, _base(inputs, "--tasks", "passkey", "--output", out,
                                       "--save-prompts", tmp_path / "out" / "r.md"),
             "one would overwrite the other")


@pytest.mark.parametrize("output", ["{tmp}/new_dir/", "{tmp}/.json", ""])
def test_output_naming_no_file(inputs, tmp_path, run_tool, nothing_loads, output):
    _refused(run_tool, tmp_path, _base(inputs, "--tasks", "passkey", "--output",
                                       output.replace("{tmp}", str(tmp_path))),
             "names no file")


@pytest.mark.parametrize("flags, needle", [
    (["--num-depths", str(10**9)], "--num-depths 1000000000: give 1 to 101 depths"),
    (["--depths", ",".join(str(i / 200) for i in range(201))], "give 1 to 101 depths"),
    (["--samples", str(10**9)], "--samples 1000000000: at most 10,000"),
    (["--batch-size", str(10**9)], "--batch-size 1000000000: at most 1,024"),
    (["--seed", "-1"], "--seed -1: give an integer in [0, 4294967295]"),
    (["--seed", str(2**32)], "--seed 4294967296"),
    (["--lengths", "4096k"], "--lengths 4194304: at most 2,097,152"),
    (["--longbench-dir", "{in}/longbench", "--longbench-lengths", "1024,4096k"],
     "--longbench-lengths 4194304: at most 2,097,152"),
])
def test_size_flags_are_bounded(inputs, tmp_path, run_tool, nothing_loads, flags, needle):
    argv = _base(inputs, "--tasks", "passkey", "--output", tmp_path / "out" / "r.json",
                 *(f.replace("{in}", str(inputs)) for f in flags))
    _refused(run_tool, tmp_path, argv, needle)
