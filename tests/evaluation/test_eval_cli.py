"""``tools/eval_longcontext.py`` end to end on a random tiny Llama: RULER + passkey + PPL
reports, --save-prompts, a perfect reader scoring 100 on every task, results written as each
task finishes, one-line errors before any work (and before the output directory exists).
The real lm-eval backend is tested in ``test_eval_lm_eval.py``."""

from __future__ import annotations

import json
import os
import subprocess
import shutil
import sys

import pytest
import torch

from megatron_endprompt.cli import eval as eval_cli
from megatron_endprompt.evaluation.core import runner
from megatron_endprompt.evaluation import suite
from megatron_endprompt.evaluation.ruler.spec import RULER_TASKS, SYNTHETIC_TASKS
from tests.evaluation.ruler.ruler_readers import perfect_answer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def first_run(tiny_model_dir, ppl_jsonl, tmp_path_factory):
    from megatron_endprompt.errors import run_cli

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("eval") / "res.json"
    try:
        rc = run_cli(eval_cli.main, [
            "--hf-dir", tiny_model_dir, "--tasks", "ruler,passkey,ppl", "--lengths", "2048",
            "--num-depths", "2", "--samples", "1", "--batch-size", "2", "--device", "cpu",
            "--ppl-data", ppl_jsonl, "--ppl-stride", "512", "--save-prompts",
            str(out)[:-5] + "_prompts.jsonl", "--output", str(out), "--no-progress"])
    finally:
        torch.set_num_threads(before)
    assert rc == 0
    return out


def test_end_to_end_outputs(first_run, tiny_model_dir):
    base = str(first_run)[:-5]
    results = json.loads(first_run.read_text())
    for suffix in ("_niah.png", "_ppl.png"):
        with open(base + suffix, "rb") as f:
            assert f.read(8) == PNG
    assert list(results["tasks"]) == [*SYNTHETIC_TASKS, "passkey"]
    ruler = results["ruler"]
    assert ruler["exact_ruler_tasks"] == ["niah_single_1", "niah_multikey_2", "niah_multikey_3",
                                          "vt", "cwe", "fwe"]
    assert ruler["substitute_haystack_tasks"] == ["niah_single_2", "niah_single_3",
                                                  "niah_multikey_1", "niah_multivalue",
                                                  "niah_multiquery"]
    assert results["meta"]["haystack"]["substitute"] is True
    assert len(results["meta"]["haystack"]["sha256"]) == 64  # the content, not only the name
    scores = [results["tasks"][t]["scores"]["2048"] for t in SYNTHETIC_TASKS]
    assert ruler["average"]["2048"] == pytest.approx(sum(scores) / len(scores), abs=0.01)
    md = open(base + ".md").read()
    assert "| niah_single_1 (RULER) |" in md and "| RULER average (11 tasks) |" in md
    assert "| vt (RULER) |" in md and "substitute haystack) |" in md and "| ppl |" in md
    ppl = results["ppl"]["by_length"]["2048"]
    assert ppl["docs"] >= 1 and ppl["tokens"] > 0 and 1.0 < ppl["ppl"] < 4000
    lines = [json.loads(x) for x in open(base + "_prompts.jsonl", encoding="utf-8")]
    assert len(lines) == 11 + 2  # one per RULER task, passkey at two depths
    tok = runner.load_tokenizer(tiny_model_dir)
    for rec in lines:
        assert set(rec) == {"task", "length", "index", "depth", "prompt", "answer", "output",
                            "score"}
        budget = RULER_TASKS[rec["task"]].tokens_to_generate if rec["task"] != "passkey" \
            else 10
        assert len(tok(rec["prompt"])["input_ids"]) + budget <= rec["length"] == 2048


def _task_of(prompt: str) -> str:
    if prompt.startswith(("Some special magic", "A special magic")):
        return "niah_"
    for head, task in (("Memorize and track", "vt"), ("Below is a numbered", "cwe"),
                       ("Read the following coded", "fwe"), ("There is an important", "passkey")):
        if prompt.startswith(head):
            return task
    raise AssertionError(prompt[:80])


def test_perfect_reader_scores_100(tiny_model_dir, tmp_path, run_tool, monkeypatch):
    """Plumbing from prompt to score: a generator that answers from the prompt text alone gets
    100 on every RULER task and the passkey, so the RULER average is 100."""
    tok = runner.load_tokenizer(tiny_model_dir)

    def oracle(model, prompts, *, max_new_tokens, pad_id, eos_ids=()):
        texts = [tok.decode(list(p), skip_special_tokens=True) for p in prompts]
        return [tok(perfect_answer(_task_of(t), t), add_special_tokens=False)["input_ids"]
                for t in texts]

    monkeypatch.setattr(runner, "greedy_generate", oracle)
    rc, out, err = run_tool(eval_cli.main, [
        "--hf-dir", tiny_model_dir, "--tasks", "ruler,passkey", "--lengths", "2048",
        "--depths", "0,1", "--samples", "1", "--output", tmp_path / "o.json",
        "--no-progress"])
    assert rc == 0, err
    results = json.loads((tmp_path / "o.json").read_text())
    assert {t: s["scores"]["2048"] for t, s in results["tasks"].items()} == {
        t: 100.0 for t in (*SYNTHETIC_TASKS, "passkey")}
    assert results["ruler"]["average"] == {"2048": 100.0}
    assert not os.path.exists(tmp_path / "o_ppl.png")  # no ppl task, no plot


def test_results_written_as_each_task_finishes(tiny_model_dir, tmp_path, monkeypatch):
    """A crash in the second task leaves the first task's results on disk."""
    calls = []
    real = runner.run_generation

    def flaky(model, tokenizer, samples, **kw):
        calls.append(samples[0].task)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return real(model, tokenizer, samples, **kw)

    monkeypatch.setattr(runner, "run_generation", flaky)
    monkeypatch.setattr(runner, "greedy_generate",
                        lambda model, prompts, **kw: [[] for _ in prompts])
    cfg = suite.EvalConfig(hf_dir=tiny_model_dir, output=str(tmp_path / "r.json"),
                           lengths=[1024], tasks=["niah_single_1", "niah_multikey_2"], samples=1,
                           progress=False)
    with pytest.raises(RuntimeError, match="boom"):
        suite.run_eval(cfg, log=lambda m: None)
    partial = json.loads((tmp_path / "r.json").read_text())
    assert list(partial["tasks"]) == ["niah_single_1"]
    assert "| niah_single_1 (RULER) | 0.0 |" in (tmp_path / "r.md").read_text()


@pytest.mark.parametrize("extra, needle", [
    (["--tasks", "niah_single_1,bogus"], "unknown task 'bogus'"),
    (["--tasks", "qa_1"], "--tasks qa_1/qa_2 need --qa-dir DIR"),  # RULER QA: local files
    (["--lengths", "100"], "--lengths 100: niah_single_1: length 100 is too short"),
    (["--lengths", "12x"], "--lengths"),
    (["--depths", "0,1.5"], "outside [0, 1]"),
    (["--tasks", "ppl"], "--ppl-data"),
    (["--samples", "0"], "--samples"),
    (["--output", "x.md"], "FILE.json"),
    (["--tasks", "niah_single_2", "--haystack", "/nonexistent/pg.json"], "--haystack"),
])
def test_bad_input_one_line(tiny_model_dir, tmp_path, run_tool, extra, needle):
    argv = ["--hf-dir", tiny_model_dir, "--tasks", "niah_single_1", "--lengths", "1024",
            "--output", tmp_path / "r.json", "--no-progress", *extra]
    rc, out, err = run_tool(eval_cli.main, argv)
    assert rc == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert not os.path.exists(tmp_path / "r.json")


def test_unwritable_output_fails_before_running(tiny_model_dir, tmp_path, run_tool,
                                                monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    monkeypatch.setattr(runner, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    for flag, path in (("--output", blocker / "r.json"),
                       ("--save-prompts", blocker / "p.jsonl")):
        argv = ["--hf-dir", tiny_model_dir, "--tasks", "niah_single_1", "--lengths", "1024",
                "--output", tmp_path / "ok.json", "--no-progress", flag, path]
        rc, _, err = run_tool(eval_cli.main, argv)
        assert rc == 2 and err.startswith(f"error: {flag} ") and "cannot write" in err, err
    assert not os.path.exists(tmp_path / "ok.json")


def test_missing_dir_and_data(tiny_model_dir, tmp_path, run_tool):
    rc, _, err = run_tool(eval_cli.main, ["--hf-dir", tmp_path / "nope", "--lengths", "512",
                                          "--output", tmp_path / "r.json"])
    assert rc == 2 and "no such directory" in err
    rc, _, err = run_tool(eval_cli.main, ["--hf-dir", tmp_path, "--lengths", "512",
                                          "--output", tmp_path / "r.json"])
    assert rc == 2 and "no config.json" in err
    short = tmp_path / "short.txt"
    short.write_text("The sky is blue.", encoding="utf-8")
    rc, _, err = run_tool(eval_cli.main, ["--hf-dir", tiny_model_dir, "--tasks", "ppl",
                                          "--ppl-data", short, "--lengths", "512",
                                          "--output", tmp_path / "r.json"])
    assert rc == 2 and "give longer documents" in err
    if not torch.cuda.is_available():
        rc, _, err = run_tool(eval_cli.main, ["--hf-dir", tiny_model_dir, "--lengths", "512",
                                              "--device", "cuda", "--output",
                                              tmp_path / "r.json"])
        assert rc == 2 and "CUDA is not available" in err


def test_lm_eval_backend_missing(tiny_model_dir, tmp_path, run_tool, monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    rc, _, err = run_tool(eval_cli.main, [
        "--hf-dir", tiny_model_dir, "--backend", "lm-eval", "--tasks", "ruler",
        "--lengths", "1024", "--output", tmp_path / "lm.json"])
    assert rc == 2 and "pip install" in err and "lm-eval" in err


def test_tool_wrapper_help():
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tools", "eval_longcontext.py"),
                           "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    for flag in ("--hf-dir", "--tasks", "--lengths", "--depths", "--samples", "--seed",
                 "--haystack", "--save-prompts", "--backend", "--ppl-data", "--output"):
        assert flag in proc.stdout


def test_too_short_length_fails_before_the_model(tiny_model_dir, tmp_path, run_tool,
                                                 monkeypatch):
    """A length too short for one task is refused before any model runs or output is
    written, even when other tasks at that length would fit."""
    monkeypatch.setattr(runner, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    for tasks, needle in (("niah_single_1,vt", "vt: length 1024 is too short"),
                          ("passkey", "passkey: length 60 is too short"),
                          ("legacy_passkey", "legacy_passkey: too short")):
        length = "60" if "passkey" in tasks else "1024"
        rc, _, err = run_tool(eval_cli.main, [
            "--hf-dir", tiny_model_dir, "--tasks", tasks, "--lengths", length,
            "--output", tmp_path / "r.json", "--save-prompts", tmp_path / "p.jsonl",
            "--no-progress"])
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not os.path.exists(tmp_path / "r.json") and not os.path.exists(tmp_path / "p.jsonl")


def test_legacy_prompts_and_stream_ppl_by_name(tiny_model_dir, ppl_jsonl, tmp_path, run_tool):
    """The pre-RULER prompts and the old stream PPL run only when named (as
    ``make replicate`` does for its published table)."""
    rc, out, err = run_tool(eval_cli.main, [
        "--hf-dir", tiny_model_dir, "--tasks", "legacy_passkey,legacy_niah_single,ppl",
        "--lengths", "400", "--depths", "0,1", "--samples", "1", "--ppl-data", ppl_jsonl,
        "--ppl-protocol", "legacy-stream", "--ppl-max-windows", "2",
        "--output", tmp_path / "old.json", "--no-progress"])
    assert rc == 0, err
    res = json.loads((tmp_path / "old.json").read_text())
    assert list(res["tasks"]) == ["legacy_passkey", "legacy_niah_single"]
    assert not res["tasks"]["legacy_passkey"]["ruler"] and "ruler" not in res
    assert all(s["prompt_tokens"] == 400 for s in res["tasks"]["legacy_passkey"]["samples"])
    ppl = res["ppl"]
    assert ppl["protocol"].startswith("legacy") and ppl["by_length"]["400"]["windows"] == 2
    assert ppl["by_length"]["400"]["tokens"] == 2 * 400


def _refusals(tiny_model_dir, tmp_path):
    """(extra argv, expected text) of inputs refused before any work."""
    no_tok = tmp_path / "no_tokenizer"
    shutil.copytree(tiny_model_dir, no_tok)
    for name in os.listdir(no_tok):
        if name.startswith(("tokenizer", "special_tokens")):
            os.unlink(no_tok / name)
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 50)
    (tmp_path / "bad.jsonl").write_text("{not json}\n", encoding="utf-8")
    cases = [
        (["--lengths", "10"], "--lengths 10"),
        (["--hf-dir", no_tok], "cannot load a tokenizer"),
        (["--tasks", "ppl", "--ppl-data", tmp_path / "missing.jsonl"], "no such file"),
        (["--tasks", "ppl", "--ppl-data", tmp_path / "empty.jsonl"], "no text to score"),
        (["--tasks", "ppl", "--ppl-data", tmp_path / "latin1.txt"], "not UTF-8"),
        (["--tasks", "ppl", "--ppl-data", tmp_path / "bad.jsonl"], "not a JSON object"),
    ]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "CUDA is not available"))
    return cases


def test_refused_runs_leave_no_output_directory(tiny_model_dir, tmp_path, run_tool):
    """Every refused evaluation is one line and leaves nothing behind, not even the output's
    directory (old code created it before validating)."""
    out_dir = tmp_path / "results" / "run1"
    for extra, needle in _refusals(tiny_model_dir, tmp_path):
        argv = ["--hf-dir", tiny_model_dir, "--tasks", "niah_single_1", "--lengths", "1024",
                "--save-prompts", out_dir / "p.jsonl", "--output", out_dir / "r.json",
                "--no-progress", *extra]
        rc, _, err = run_tool(eval_cli.main, argv)
        assert rc == 2 and "Traceback" not in err and needle in err, (extra, err)
        assert len(err.strip().splitlines()) == 1, err
        assert not os.path.exists(tmp_path / "results"), extra


def test_unused_haystack_and_directory_output_refused(tiny_model_dir, tmp_path, run_tool):
    """``--haystack`` with no essay task (old: silently unused, exit 0) and ``--output`` naming
    an existing directory (old: wrote ``DIR.json`` beside it) are refused in one line."""
    hay = tmp_path / "hay.txt"
    hay.write_text("An essay. " * 200, encoding="utf-8")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    for extra, needle in (
            (["--haystack", hay, "--output", tmp_path / "r.json"], "none of --tasks uses it"),
            (["--output", out_dir], f"--output {out_dir} is a directory"),
            (["--backend", "lm-eval", "--tasks", "niah_single_2", "--haystack", hay,
              "--output", tmp_path / "r.json"], "native backend only"),
            (["--backend", "lm-eval", "--ppl-data", hay, "--output", tmp_path / "r.json"],
             "--ppl-data is read by the native backend only"),
            (["--lm-eval-include", tmp_path, "--output", tmp_path / "r.json"],
             "needs --backend lm-eval")):
        argv = ["--hf-dir", tiny_model_dir, "--tasks", "niah_single_1", "--lengths", "1024",
                "--samples", "1", "--no-progress", *extra]
        rc, _, err = run_tool(eval_cli.main, argv)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, (extra, err)
    assert sorted(os.listdir(tmp_path)) == ["hay.txt", "out"] and not os.listdir(out_dir)
