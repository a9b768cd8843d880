"""Every bad input of the data path: one line ``error: ...`` naming the file/flag, exit code 2,
no partial output (no ``PREFIX.*``, no temporaries), and an existing good output left intact.
Also interrupted runs. (Sidecars refused by inspect: tests/data/sidecar/test_bad_sidecar.py.)"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_endprompt.cli import inspect as inspect_cli
from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path

# tests/data is on sys.path under pytest (rootdir-relative test modules)
from tests.support.bad_input import (
    GOOD, REPO, SUFFIXES, B, P, _assert_one_error_line, _copy_good, _drop_flag, _jsonl,
    _null_args, _outputs, _snapshot,
)


# -- fatal preprocessing inputs ------------------------------------------------------------
# Each case: d (a scratch dir), args (spm_args) -> (argv builder prefix -> argv, needles).
def _case_malformed_json(d, args):
    path = _jsonl(d / "in.jsonl", [GOOD, GOOD, '{"text": "unterminated', GOOD])
    return (lambda p: args(p, inputs=[path])), [f"{path}:3", "malformed JSON"]


def _case_malformed_json_workers(d, args):
    path = _jsonl(d / "in.jsonl", [GOOD] * 20 + ["{'text': 'single quotes'}"] + [GOOD] * 5)
    return (lambda p: args(p, "--workers", 2, inputs=[path])), [f"{path}:21", "malformed JSON"]


def _case_missing_key(d, args):
    path = _jsonl(d / "in.jsonl", [GOOD, json.dumps({"body": "x"})])
    return (lambda p: args(p, inputs=[path])), [f"{path}:2", "'text'", "--json-keys"]


def _case_missing_second_key(d, args):
    path = _jsonl(d / "in.jsonl", [json.dumps({"title": "a", "text": "b"}),
                                   json.dumps({"title": "a"})])
    return (lambda p: args(p, "--json-keys", "title", "text", inputs=[path])), \
        [f"{path}:2", "'text'", "--json-keys"]


def _case_non_utf8(d, args):
    path = _jsonl(d / "in.jsonl", [GOOD, b'{"text": "caf\xe9 au lait"}'])
    return (lambda p: args(p, inputs=[path])), [f"{path}:2", "UTF-8"]


def _case_not_an_object(d, args):
    path = _jsonl(d / "in.jsonl", ['["text", "a list"]'])
    return (lambda p: args(p, inputs=[path])), [f"{path}:1", "JSON object"]


def _case_text_not_string(d, args):
    path = _jsonl(d / "in.jsonl", [json.dumps({"text": 5})])
    return (lambda p: args(p, inputs=[path])), [f"{path}:1", "'text'"]


def _case_missing_tokenizer(d, args):
    model = str(d / "no_such.model")
    return (lambda p: args(p, "--tokenizer-model", model)), ["--tokenizer-model", model]


def _case_garbage_tokenizer(d, args):
    model = d / "garbage.model"
    model.write_text("this is not a sentencepiece model\n")
    return (lambda p: args(p, "--tokenizer-model", model)), ["--tokenizer-model", str(model)]


def _case_unknown_tokenizer_type(d, args):
    return (lambda p: args(p, "--tokenizer-type", "NoSuchTokenizer")), \
        ["--tokenizer-type", "NoSuchTokenizer"]


def _case_null_without_vocab(d, args):
    path = _jsonl(d / "in.jsonl", ["1 2 3"])
    return (lambda p: _drop_flag(_null_args(p, path), "--vocab-size")), ["--vocab-size"]


def _case_token_id_ge_vocab(d, args):
    path = _jsonl(d / "in.jsonl", [json.dumps({"text": "1 2 3 4 5 6"}),
                                   json.dumps({"text": "5 150 7"})])
    return (lambda p: _null_args(p, path, vocab=100)), [f"{path}:2", "150", "--vocab-size"]


def _case_negative_token_id(d, args):
    path = _jsonl(d / "in.jsonl", [json.dumps({"text": "1 2 3 4 5 6"}),
                                   json.dumps({"text": "1 -5 3 4 5 6 7"})])
    return (lambda p: _null_args(p, path, vocab=100)), [f"{path}:2", "-5", "negative"]


def _case_text_not_integers_for_null_tokenizer(d, args):
    path = _jsonl(d / "in.jsonl", [json.dumps({"text": "1 2 3 4 5 6"}),
                                   json.dumps({"text": "hello world"})])
    return (lambda p: _null_args(p, path, vocab=100)), [f"{path}:2", "NullTokenizer", "hello"]


def _case_b_ge_p(d, args):
    return (lambda p: args(p, "--terminal-length", P)), ["--terminal-length", f"P={P}"]


def _case_b_zero(d, args):
    return (lambda p: args(p, "--terminal-length", 0)), ["--terminal-length"]


def _case_no_b(d, args):
    return (lambda p: _drop_flag(args(p), "--terminal-length")), ["--terminal-length"]


def _case_l_le_p(d, args):
    return (lambda p: args(p, "--target-length", P)), ["--target-length", f"P={P}"]


def _case_w_zero(d, args):
    return (lambda p: args(p, "--terminal-loss-weight", 0)), ["--terminal-loss-weight"]


def _case_w_negative(d, args):
    return (lambda p: args(p, "--terminal-loss-weight", -0.5)), ["--terminal-loss-weight"]


def _case_context_weight_negative(d, args):
    return (lambda p: args(p, "--context-loss-weight", -1)), ["--context-loss-weight"]


def _case_pose_cannot_fit(d, args):
    return (lambda p: args(p, "--pose-chunks", P - B + 1)), ["--pose-chunks"]


def _case_pose_zero(d, args):
    return (lambda p: args(p, "--pose-chunks", 0)), ["--pose-chunks"]


def _case_prompt_too_long(d, args):
    # the built-in "This is the end of text, ..." prompt is longer than P = 8 tokens
    return (lambda p: args(p, "--terminal-source", "prompt", "--seq-length", 8)), \
        ["--terminal-prompts", "--seq-length"]


def _case_pose_cannot_fit_prompt(d, args):
    prompts = d / "prompts.txt"
    prompts.write_text("End.\n")  # a few tokens: a = 20 - len < 19 chunks
    return (lambda p: args(p, "--terminal-source", "prompt", "--terminal-prompts", prompts,
                           "--seq-length", 20, "--pose-chunks", 19)), ["--pose-chunks"]


def _case_prompts_file_missing(d, args):
    path = str(d / "no_prompts.txt")
    return (lambda p: args(p, "--terminal-source", "prompt", "--terminal-prompts", path)), \
        ["--terminal-prompts", path]


def _case_prompts_file_empty(d, args):
    path = d / "prompts.txt"
    path.write_text("\n   \n")
    return (lambda p: args(p, "--terminal-source", "prompt", "--terminal-prompts", path)), \
        ["--terminal-prompts", str(path)]


def _case_input_missing(d, args):
    path = str(d / "missing.jsonl")
    return (lambda p: args(p, inputs=[path])), ["--input", path]


def _case_glob_no_match(d, args):
    pattern = str(d / "none-*.jsonl")
    return (lambda p: args(p, inputs=[pattern])), ["--input", pattern]


def _case_no_sample(d, args):
    path = _jsonl(d / "in.jsonl", [GOOD, json.dumps({"text": "  "})])
    return (lambda p: args(p, inputs=[path])), ["--input", "no sample", "--seq-length"]


def _case_workers_zero(d, args):
    return (lambda p: args(p, "--workers", 0)), ["--workers"]


CASES = {name[len("_case_"):]: fn for name, fn in globals().items() if name.startswith("_case_")}


@pytest.mark.parametrize("over_existing", [False, True], ids=["fresh", "over-existing"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fatal_input(case, over_existing, run_tool, spm_args, good_output, tmp_path):
    scratch = tmp_path / "in"
    scratch.mkdir()
    make_argv, needles = CASES[case](scratch, spm_args)
    outdir = tmp_path / "out"
    if over_existing:
        prefix = _copy_good(good_output, outdir)
        before = _snapshot(prefix)
    else:
        outdir.mkdir()
        prefix = str(outdir / "data")
    rc, out, err = run_tool(preprocess_cli.main, make_argv(prefix))
    _assert_one_error_line(rc, err, *needles)
    if over_existing:
        assert _snapshot(prefix) == before  # the old output is untouched ...
        assert _outputs(prefix) == [prefix + s for s in sorted(SUFFIXES)]  # ... and alone
        read_sidecar(sidecar_path(prefix), prefix=prefix)
    else:
        assert _outputs(prefix) == []
    assert os.listdir(outdir) == [] or over_existing


@pytest.mark.parametrize("where", ["under-a-file", "under-proc", "missing-dir"])
def test_output_prefix_not_writable(where, run_tool, spm_args, tmp_path):
    if where == "under-a-file":
        (tmp_path / "afile").write_text("a regular file\n")
        prefix = str(tmp_path / "afile" / "out")
    elif where == "under-proc":
        prefix = f"/proc/endprompt-test-{os.getpid()}/out"
    else:
        prefix = str(tmp_path / "no_such_dir" / "out")
    rc, out, err = run_tool(preprocess_cli.main, spm_args(prefix))
    _assert_one_error_line(rc, err, "--output-prefix", prefix)
    assert _outputs(prefix) == []
    assert sorted(os.listdir(tmp_path)) == (["afile"] if where == "under-a-file" else [])
    if where == "under-proc":
        assert not glob.glob(f"/proc/endprompt-test-{os.getpid()}*")
        # and directly in /proc
        rc, out, err = run_tool(preprocess_cli.main, spm_args("/proc/endprompt-test-out"))
        _assert_one_error_line(rc, err, "--output-prefix", "/proc/endprompt-test-out")
        assert not glob.glob("/proc/endprompt-test-out*")


@pytest.mark.process
def test_preprocess_tool_subprocess_fails_cleanly(spm_args, tmp_path):
    """The real script in a fresh interpreter: exit code 2, exactly one stderr line, no
    traceback, no output files."""
    path = _jsonl(tmp_path / "in.jsonl", [GOOD, "{not json"])
    prefix = str(tmp_path / "out")
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "tools", "preprocess_endprompt.py"),
         *spm_args(prefix, inputs=[path])], capture_output=True, text=True, timeout=120)
    _assert_one_error_line(proc.returncode, proc.stderr, f"{path}:2", "malformed JSON")
    assert proc.stdout == ""
    assert _outputs(prefix) == []


# -- skipped, not fatal --------------------------------------------------------------------
def test_empty_and_whitespace_documents_are_skipped_and_counted(run_tool, spm_args, spm_corpus,
                                                                good_output, tmp_path):
    with open(spm_corpus.path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    noisy = (lines[:5] + [json.dumps({"text": ""}), "", json.dumps({"text": " \n\t "})]
             + lines[5:20] + ["   ", json.dumps({"text": "\u3000\u00a0"})] + lines[20:])
    path = _jsonl(tmp_path / "noisy.jsonl", noisy)
    prefix = str(tmp_path / "noisy")
    rc, out, err = run_tool(preprocess_cli.main, spm_args(prefix, inputs=[path]))
    assert rc == 0, err
    summary = read_sidecar(sidecar_path(prefix), prefix=prefix).header.stats
    assert summary["documents_skipped"] == {"empty or whitespace-only text": 3, "blank line": 2}
    assert summary["documents_used"] == len(lines)
    assert summary["documents_read"] == len(noisy) == len(lines) + 5
    assert "skipped (empty or whitespace-only text): 3" in out
    assert "skipped (blank line): 2" in out
    # skipping changes nothing else: same data as the clean corpus
    assert Path(prefix + ".bin").read_bytes() == Path(good_output + ".bin").read_bytes()
    assert Path(prefix + ".idx").read_bytes() == Path(good_output + ".idx").read_bytes()


# -- interrupted runs ----------------------------------------------------------------------
def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("over_existing", [False, True], ids=["fresh", "over-existing"])
@pytest.mark.parametrize("where", ["finalize", "sidecar", "mid-stream"])
def test_interrupted_run_leaves_nothing_complete(where, over_existing, run_tool, spm_args,
                                                 good_output, tmp_path, monkeypatch):
    import megatron_endprompt.data.prepare.build_sidecar as pp
    from megatron_endprompt.data.sidecar.indexed_io import IndexedWriter as IndexedDatasetBuilder
    import megatron_endprompt.data.tokenize.encode as encode

    workers = 1
    if where == "finalize":
        monkeypatch.setattr(IndexedDatasetBuilder, "finalize", _interrupt)
    elif where == "sidecar":
        monkeypatch.setattr(pp, "write_sidecar", _interrupt)
    else:  # Ctrl-C while the worker pool is streaming
        calls = {"n": 0}
        original = IndexedDatasetBuilder.add_document

        def add_document(self, tokens, lengths):
            calls["n"] += 1
            if calls["n"] == 10:
                raise KeyboardInterrupt
            return original(self, tokens, lengths)

        monkeypatch.setattr(IndexedDatasetBuilder, "add_document", add_document)
        monkeypatch.setattr(encode, "_BATCH_LINES", 2)
        workers = 2
    if over_existing:
        prefix = _copy_good(good_output, tmp_path)
        before = _snapshot(prefix)
    else:
        prefix = str(tmp_path / "data")
    rc, out, err = run_tool(preprocess_cli.main, spm_args(prefix, "--workers", workers))
    _assert_one_error_line(rc, err, "interrupted", code=130)
    assert not glob.glob(str(tmp_path / "*.tmp-*"))
    if over_existing:
        assert _snapshot(prefix) == before
    else:
        assert _outputs(prefix) == []


@pytest.mark.parametrize("at_rename", [1, 2, 3, 4])
def test_interrupt_while_renaming_keeps_a_complete_set(at_rename, run_tool, spm_args, spm_corpus,
                                                       good_output, tmp_path, monkeypatch):
    """Interrupted at any rename of the commit (journal, .endprompt, .idx, .bin): the prefix is
    the complete old dataset (before the journal) or the complete new one (after it), never a
    mix and never nothing (an earlier scheme deleted the old .bin first and lost it)."""
    prefix = _copy_good(good_output, tmp_path)
    before = _snapshot(prefix)
    lines = Path(spm_corpus.path).read_text(encoding="utf-8").splitlines()
    other = _jsonl(tmp_path / "other.jsonl", lines[:15])
    original, calls = os.replace, {"n": 0}

    def replace(src, dst):
        if "tokenizer-verdicts" in str(dst):  # the cold run caching its tokenizer verdict
            return original(src, dst)
        calls["n"] += 1
        if calls["n"] == at_rename:
            raise KeyboardInterrupt
        return original(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    rc, out, err = run_tool(preprocess_cli.main, spm_args(prefix, inputs=[other]))
    monkeypatch.undo()
    _assert_one_error_line(rc, err, "interrupted", code=130)
    assert not glob.glob(str(tmp_path / "*.tmp-*"))
    assert _outputs(prefix) == [prefix + s for s in sorted(SUFFIXES)]
    sidecar = read_sidecar(sidecar_path(prefix), prefix=prefix)
    assert (_snapshot(prefix) == before) == (at_rename == 1)
    good_samples = read_sidecar(good_output + ".endprompt").header.num_samples
    assert (sidecar.header.num_samples == good_samples) == (at_rename == 1)  # old or new
    rc, out, err = run_tool(inspect_cli.main, [prefix])
    assert rc == 0, err


