"""Preprocessing and inspection refusals that must leave nothing behind and name the right
thing: a refused GPT-2 ``--vocab-file/--merge-file`` run keeps no wrapped tokenizer directory,
``--partitions -1`` blames ``--partitions``, and ``inspect`` on a sidecar that is a directory
says so (not "not found")."""

from __future__ import annotations


import pytest

from megatron_endprompt.cli import inspect as inspect_cli
from megatron_endprompt.cli import preprocess as preprocess_cli
from tests.support.gpt2_files import gpt2_vocab_and_merges
from tests.support.refusal import assert_refused


@pytest.fixture(scope="module")
def gpt2_files(spm_corpus, tmp_path_factory):
    return gpt2_vocab_and_merges(spm_corpus.texts, tmp_path_factory.mktemp("gpt2") / "files",
                                 vocab_size=300)


#: Refusals that come after the tokenizer flags were read: the options' own check, the layout,
#: and a check of the inputs inside the pipeline.
REFUSED = {
    "partitions": (["--partitions", "-1"], "--partitions -1"),
    "layout": (["--target-length", "8"], "--target-length"),
    "missing_input": (["--input", "MISSING"], "MISSING"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
@pytest.mark.parametrize("nested", [False, True], ids=["existing_dir", "new_dir"])
def test_refused_gpt2_run_leaves_no_wrapped_tokenizer(spm_args, gpt2_files, run_tool, tmp_path,
                                                      case, nested):
    """The wrapped directory (``gpt2-hf-*``) is written before the checks run; a refused run
    removes it again (and the output directory it had to create)."""
    vocab, merges = gpt2_files
    extra, needle = REFUSED[case]
    out = tmp_path / "out"
    out.mkdir()
    prefix = out / "new" / "data" if nested else out / "data"
    if case == "missing_input":
        extra = ["--input", str(tmp_path / "MISSING.jsonl")]
    argv = spm_args(prefix, "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab,
                    "--merge-file", merges, *extra)
    assert_refused(run_tool, preprocess_cli.main, argv, needle, watch=[tmp_path])


def test_a_reused_wrapped_tokenizer_stays_after_a_refused_run(spm_args, gpt2_files, run_tool,
                                                               tmp_path):
    """One an earlier (successful) run made is shared, not this run's to remove."""
    vocab, merges = gpt2_files
    flags = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file",
             merges]
    rc, _, err = run_tool(preprocess_cli.main, spm_args(tmp_path / "ok", *flags))
    assert rc == 0, err
    wrapped = sorted(p.name for p in tmp_path.glob("gpt2-hf-*"))
    assert len(wrapped) == 1
    assert_refused(run_tool, preprocess_cli.main,
                   spm_args(tmp_path / "bad", *flags, "--partitions", "0"), "--partitions 0",
                   watch=[tmp_path])


@pytest.mark.parametrize("value", ["-1", "0"])
def test_partitions_below_one_blames_partitions(spm_args, run_tool, tmp_path, value):
    line = assert_refused(run_tool, preprocess_cli.main,
                          spm_args(tmp_path / "data", "--partitions", value),
                          f"--partitions {value} must be >= 1", watch=[tmp_path])
    assert "--partition-index" not in line


@pytest.fixture(scope="module")
def prefix(spm_args, tmp_path_factory):
    """A preprocessed SentencePiece prefix (read only)."""
    from megatron_endprompt.errors import run_cli

    out = tmp_path_factory.mktemp("inspect_guard") / "data"
    assert run_cli(preprocess_cli.main, spm_args(out)) == 0
    return str(out)


@pytest.mark.parametrize("suffix", [".endprompt", ".named.endprompt"])
def test_inspect_sidecar_that_is_a_directory(prefix, run_tool, tmp_path, suffix):
    """A directory where the sidecar belongs: said to be a directory, not "not found" (with
    that very name listed among the sidecars there)."""
    import os
    import shutil

    copy = tmp_path / "data"
    for s in (".bin", ".idx", ".endprompt"):
        shutil.copyfile(prefix + s, str(copy) + s)
    if suffix == ".endprompt":
        os.remove(str(copy) + ".endprompt")
    os.mkdir(str(copy) + suffix)
    argv = [copy] + (["--name", "named"] if suffix != ".endprompt" else [])
    line = assert_refused(run_tool, inspect_cli.main, argv,
                          f"{copy}{suffix} is a directory, not an EndPrompt sidecar",
                          watch=[tmp_path])
    assert "not found" not in line


def test_inspect_data_file_that_is_a_directory(prefix, run_tool, tmp_path):
    import os
    import shutil

    copy = tmp_path / "data"
    for s in (".idx", ".endprompt"):
        shutil.copyfile(prefix + s, str(copy) + s)
    os.mkdir(str(copy) + ".bin")
    assert_refused(run_tool, inspect_cli.main, [copy], f"{copy}.bin is a directory, not a data "
                   "file", watch=[tmp_path])
