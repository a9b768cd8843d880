"""``tools/eval_longcontext.py`` end to end on a random tiny Llama: JSON, markdown and PNGs,
determinism under a seed, a perfect generator scoring 100 %, and one-line errors for bad
input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from megatron_endprompt.cli import eval as eval_cli
from megatron_endprompt.evaluation import runner, tasks
from test_eval_tasks import perfect_answer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PNG = b"\x89PNG\r\n\x1a\n"


def _argv(model_dir, out, ppl, *extra):
    return ["--hf-dir", model_dir, "--tasks", "passkey,niah,ppl", "--lengths", "400,512",
            "--num-depths", "3", "--samples", "2", "--batch-size", "4", "--seed", "5",
            "--device", "cpu", "--ppl-data", ppl, "--ppl-stride", "128",
            "--ppl-max-windows", "4", "--output", str(out), "--no-progress", *extra]


def _strip_meta(results):
    return {k: v for k, v in results.items() if k != "meta"}


@pytest.fixture(scope="module")
def first_run(tiny_model_dir, ppl_jsonl, tmp_path_factory):
    from megatron_endprompt.errors import run_cli

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("eval") / "res.json"
    try:
        rc = run_cli(eval_cli.main, _argv(tiny_model_dir, out, ppl_jsonl))
    finally:
        torch.set_num_threads(before)
    assert rc == 0
    return out


def test_end_to_end_outputs(first_run):
    out = first_run
    base = str(out)[:-5]
    results = json.loads(out.read_text())
    for suffix in ("_niah.png", "_ppl.png"):
        with open(base + suffix, "rb") as f:
            assert f.read(8) == PNG
    md = open(base + ".md").read()
    assert md.startswith("| task | 400 | 512 |")
    meta = results["meta"]
    assert meta["lengths"] == [400, 512] and meta["depths"] == [0.0, 0.5, 1.0]
    assert meta["max_position_embeddings"] == 256
    retrieval = results["retrieval"]
    assert list(retrieval) == ["passkey", *tasks.NIAH_TASKS]
    for task, summ in retrieval.items():
        assert set(summ["accuracy"]) == {"400", "512"}
        assert set(summ["by_depth"]["400"]) == {"0", "0.5", "1"}
        assert len(summ["samples"]) == 2 * 3 * 2
        for rec in summ["samples"]:
            assert 0.0 <= rec["score"] <= 1.0 and isinstance(rec["prediction"], str)
            assert f"| {task} (acc %) |" in md
    ppl = results["ppl"]["by_length"]
    for n in ("400", "512"):
        assert ppl[n]["windows"] == 4 and ppl[n]["tokens"] == 4 * int(n)
        assert 1.0 < ppl[n]["ppl"] < 10 * 400  # random model: about the vocabulary size


def test_deterministic_under_seed(first_run, tiny_model_dir, ppl_jsonl, tmp_path, run_tool):
    rc, out, err = run_tool(eval_cli.main, _argv(tiny_model_dir, tmp_path / "again.json",
                                                 ppl_jsonl))
    assert rc == 0, err
    assert "exceed the model's max_position_embeddings (256)" in err
    assert "wrote" in out and "| passkey (acc %) |" in out
    a = json.loads(first_run.read_text())
    b = json.loads((tmp_path / "again.json").read_text())
    assert _strip_meta(a) == _strip_meta(b)


def test_perfect_generator_scores_100(tiny_model_dir, tmp_path, run_tool, monkeypatch):
    """The plumbing from prompt to score: a generator that reads the needles off the prompt
    (the perfect reader) gets 100 % on every task, depth and length."""
    tok = runner.load_tokenizer(tiny_model_dir)

    def oracle(model, prompts, *, max_new_tokens, pad_id, eos_ids=()):
        texts = [perfect_answer(tok.decode(list(p), skip_special_tokens=True)) for p in prompts]
        return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]

    monkeypatch.setattr(runner, "greedy_generate", oracle)
    rc, out, err = run_tool(eval_cli.main, [
        "--hf-dir", tiny_model_dir, "--tasks", "passkey,niah", "--lengths", "420,600",
        "--depths", "0,0.33,1", "--samples", "1", "--output", tmp_path / "o.json",
        "--no-progress"])
    assert rc == 0, err
    results = json.loads((tmp_path / "o.json").read_text())
    for summ in results["retrieval"].values():
        assert summ["accuracy"] == {"420": 1.0, "600": 1.0}
    assert not os.path.exists(tmp_path / "o_ppl.png")  # no ppl task, no plot


@pytest.mark.parametrize("extra, needle", [
    (["--tasks", "passkey,bogus"], "unknown task 'bogus'"),
    (["--lengths", "100"], "too short for passkey"),
    (["--lengths", "12x"], "--lengths"),
    (["--depths", "0,1.5"], "outside [0, 1]"),
    (["--tasks", "ppl"], "--ppl-data"),
    (["--samples", "0"], "--samples"),
    (["--output", "x.md"], "FILE.json"),
])
def test_bad_input_one_line(tiny_model_dir, tmp_path, run_tool, extra, needle):
    argv = ["--hf-dir", tiny_model_dir, "--lengths", "512", "--output", tmp_path / "r.json",
            "--no-progress", *extra]
    rc, out, err = run_tool(eval_cli.main, argv)
    assert rc == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert not os.path.exists(tmp_path / "r.json")


def test_missing_dir_and_data(tiny_model_dir, tmp_path, run_tool):
    rc, _, err = run_tool(eval_cli.main, ["--hf-dir", tmp_path / "nope", "--lengths", "512",
                                          "--output", tmp_path / "r.json"])
    assert rc == 2 and "no such directory" in err
    rc, _, err = run_tool(eval_cli.main, ["--hf-dir", tmp_path, "--lengths", "512",
                                          "--output", tmp_path / "r.json"])
    assert rc == 2 and "no config.json" in err
    rc, _, err = run_tool(eval_cli.main, ["--hf-dir", tiny_model_dir, "--tasks", "ppl",
                                          "--ppl-data", tmp_path / "none.txt", "--lengths",
                                          "512", "--output", tmp_path / "r.json"])
    assert rc == 2 and "no such file" in err
    short = tmp_path / "short.txt"
    short.write_text("The sky is blue.", encoding="utf-8")
    rc, _, err = run_tool(eval_cli.main, ["--hf-dir", tiny_model_dir, "--tasks", "ppl",
                                          "--ppl-data", short, "--lengths", "512",
                                          "--output", tmp_path / "r.json"])
    assert rc == 2 and "give more text" in err
    if not torch.cuda.is_available():
        rc, _, err = run_tool(eval_cli.main, ["--hf-dir", tiny_model_dir, "--lengths", "512",
                                              "--device", "cuda", "--output",
                                              tmp_path / "r.json"])
        assert rc == 2 and "CUDA is not available" in err


def test_tool_wrapper_help():
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tools", "eval_longcontext.py"),
                           "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    for flag in ("--hf-dir", "--tasks", "--lengths", "--depths", "--num-depths", "--samples",
                 "--seed", "--device", "--dtype", "--batch-size", "--ppl-data", "--output"):
        assert flag in proc.stdout
