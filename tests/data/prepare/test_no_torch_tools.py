"""The data tools that only read or write the corpus start without torch/Megatron-Core (their
start-up was mostly torch's import): the sidecar tool on an existing corpus and ``inspect`` (text
via ``tokenizers`` alone when the recorded tokenizer.json still has the recorded vocabulary), and
preprocessing once a tokenizer verdict is cached."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np

from megatron_endprompt.cli import inspect as inspect_cli
from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.tokenize import tokenizer as tokenizer_mod
from megatron_endprompt.data.sidecar.indexed_io import IndexedWriter

ROOT = str(pathlib.Path(__file__).resolve().parents[3])  # the repository root
_PROBE = """
import sys, runpy
sys.argv = {argv!r}
try:
    runpy.run_path({tool!r}, run_name="__main__")
except SystemExit as e:
    assert e.code in (0, None), e.code
heavy = sorted(m for m in ("torch", "megatron.core", "transformers") if m in sys.modules)
print("HEAVY=" + ",".join(heavy))
"""


def _heavy_modules(tool: str, argv: list[str]) -> str:
    code = _PROBE.format(argv=[tool, *map(str, argv)], tool=os.path.join(ROOT, "tools", tool))
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.rsplit("HEAVY=", 1)[1].strip()


def test_sidecar_tool_and_inspect_do_not_import_torch(llama3_args, run_tool, tmp_path):
    prefix = tmp_path / "c"
    w = IndexedWriter(f"{prefix}.bin", np.uint16)
    for d in np.random.default_rng(0).integers(0, 1000, (40, 50)):
        w.add_document(d, [len(d)])
    w.finalize(f"{prefix}.idx")
    assert _heavy_modules("build_endprompt_sidecar.py", [
        "--data-prefix", prefix, "--seq-length", 32, "--target-length", 256,
        "--terminal-length", 8, "--no-progress"]) == ""
    assert _heavy_modules("inspect_endprompt.py", [prefix, "--index", 1]) == ""
    # a preprocessed prefix with a recorded HF tokenizer: text from tokenizer.json alone
    assert run_tool(preprocess_cli.main, llama3_args(tmp_path / "p"))[0] == 0
    assert _heavy_modules("inspect_endprompt.py", [tmp_path / "p", "--index", 1]) == ""


def test_inspect_text_without_megatron_equals_megatrons(llama3_args, run_tool, tmp_path,
                                                        monkeypatch):
    assert run_tool(preprocess_cli.main, llama3_args(tmp_path / "p"))[0] == 0
    rc, light, err = run_tool(inspect_cli.main, [tmp_path / "p", "--index", 2, "--json"])
    assert rc == 0, err
    monkeypatch.setattr(tokenizer_mod, "json_detokenizer", lambda rec: None)
    rc, full, err = run_tool(inspect_cli.main, [tmp_path / "p", "--index", 2, "--json"])
    assert rc == 0, err
    a, b = json.loads(light)["sample"], json.loads(full)["sample"]
    assert a["context_text"] and a == b


def test_preprocess_with_a_cached_verdict_does_not_import_torch(llama3_args, run_tool, tmp_path):
    """The tiktoken and HF paths of a warm run (a cached tokenizer verdict, written by the cold
    run) import none of torch, Megatron-Core, transformers; the bytes are the cold run's."""
    assert run_tool(preprocess_cli.main, llama3_args(tmp_path / "cold", "--workers", 2))[0] == 0
    for backend in ("tiktoken", "hf"):
        prefix = tmp_path / f"warm_{backend}"
        assert _heavy_modules("preprocess_endprompt.py", llama3_args(
            prefix, "--workers", 2, "--tokenizer-backend", backend)) == ""
        for s in (".bin", ".idx"):
            assert (tmp_path / f"cold{s}").read_bytes() == open(f"{prefix}{s}", "rb").read()


def test_sentencepiece_preprocess_with_a_cached_verdict_does_not_import_torch(
        spm_args, run_tool, tmp_path):
    """A warm SentencePiece run (the model read by ``sentencepiece`` alone, its verdict cached
    by the cold run) imports none of torch, Megatron-Core, transformers; same bytes."""
    rc, out, err = run_tool(preprocess_cli.main, spm_args(tmp_path / "cold", "--workers", 2))
    assert rc == 0 and "sentencepiece alone matched it, verdict cached" in out, err
    prefix = tmp_path / "warm"
    assert _heavy_modules("preprocess_endprompt.py", spm_args(prefix, "--workers", 2)) == ""
    for s in (".bin", ".idx"):
        assert (tmp_path / f"cold{s}").read_bytes() == open(f"{prefix}{s}", "rb").read()
