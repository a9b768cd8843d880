"""Preprocessing end to end (tools/preprocess_endprompt.py and tools/inspect_endprompt.py) on a
generated corpus with a SentencePiece model trained in the session (tests/conftest.py)."""

from __future__ import annotations

import glob
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset

from megatron_endprompt.cli import inspect as inspect_cli
from megatron_endprompt.cli import preprocess as preprocess_cli
from megatron_endprompt.data.prepare.prompts import BUILTIN_PROMPTS, tokenize_prompts
from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
from megatron_endprompt.data.sidecar.spans import sample_reader
from megatron_endprompt.layout import (
    describe_runs,
    loss_weights_from_record,
    positions_from_record,
)
from megatron_endprompt.loss_weights import LossWeights

P, L, B = 64, 512, 8  # as in tests/conftest.py (spm_args)
REPO = str(pathlib.Path(__file__).resolve().parents[3])  # the repository root


# -- helpers -------------------------------------------------------------------------------
def _preprocess(run_tool, argv) -> dict:
    """Run the tool in-process with --summary-json; returns the printed summary."""
    rc, out, err = run_tool(preprocess_cli.main, [*argv, "--summary-json"])
    assert rc == 0, err
    assert "Traceback" not in err
    return json.loads(out[out.index("{"):])


def _doc_tokens(tok, texts) -> list[np.ndarray]:
    """Each document tokenized as preprocessing does with --append-eod."""
    return [np.asarray([*tok.tokenize(t), tok.eod], dtype=np.int64) for t in texts]


def _read(prefix):
    """(samples as int64 arrays, verified sidecar)."""
    sc = read_sidecar(sidecar_path(prefix), prefix=prefix)
    tokens = sample_reader(prefix, sc)
    samples = [np.asarray(tokens(i), dtype=np.int64) for i in range(sc.header.num_samples)]
    return samples, sc


def _files(prefix) -> dict[str, bytes]:
    out = {}
    for suffix in (".bin", ".idx", ".endprompt"):
        with open(prefix + suffix, "rb") as f:
            out[suffix] = f.read()
    return out


def _check_common(prefix, summary, *, n_lines, placement, pose_chunks):
    """What every successful run must satisfy, whatever the terminal source."""
    prefix = str(prefix)
    for suffix in (".bin", ".idx", ".endprompt"):
        assert os.path.isfile(prefix + suffix)
    assert not glob.glob(prefix + ".*.tmp-*"), "temporaries left behind"
    samples, sc = _read(prefix)  # stock Megatron reads the data; the sidecar belongs to it
    n = len(samples)
    assert n > 0
    assert all(len(s) == P + 1 for s in samples)
    # the .bin holds the tokenized documents, one sequence each (as Megatron-LM writes them)
    data = IndexedDataset(prefix)
    assert int(data.sequence_lengths.sum()) == summary["tokens_in"]
    assert len(data.sequence_lengths) == summary["documents_used"]
    assert sc.header.num_samples == n == summary["samples_written"]
    assert sc.records.shape == (n, 2 * pose_chunks)
    # summary counts are consistent
    assert summary["documents_read"] == n_lines
    assert summary["documents_read"] == (summary["documents_used"]
                                         + sum(summary["documents_skipped"].values()))
    assert summary["tokens_in_samples"] == n * (P + 1)
    assert os.path.getsize(prefix + ".bin") == sc.header.bin_bytes
    stored = dict(sc.header.stats)
    # the run's own facts (time, how the tokenizer was loaded) are not in the header
    assert {k: v for k, v in summary.items() if k not in ("seconds", "tokenizer_note")} == stored
    # every record is a valid layout of the requested kind
    layout = sc.layout
    assert (layout.seq_length, layout.target_length) == (P, L)
    assert (layout.placement, layout.pose_chunks) == (placement, pose_chunks)
    contiguous = 0
    for rec in np.asarray(sc.records):
        a, t = int(rec[0]), int(rec[1])
        b = P - a
        if np.array_equal(positions_from_record(rec, P), np.arange(P)):
            contiguous += 1  # document-tail's samples from short documents only
            assert t == a
            continue
        if placement == "fixed":
            assert t == L - b
        else:
            assert a <= t <= L - b
        pos = positions_from_record(rec, P)
        assert len(pos) == P and pos[0] == 0 and pos[-1] < L
        assert np.all(np.diff(pos) > 0)
        assert np.array_equal(pos[a:], np.arange(t, t + b))
        if pose_chunks == 1:
            assert np.array_equal(pos[:a], np.arange(a))
        else:
            assert pos[a - 1] < t
    assert contiguous == summary.get("samples_contiguous_positions", 0)
    return samples, sc


def _n_lines(path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


# -- end to end, per terminal source -------------------------------------------------------
@pytest.mark.parametrize("placement,pose", [("fixed", 1), ("random", 2)])
def test_continuation(run_tool, spm_args, spm_corpus, spm_tokenizer, tmp_path, placement, pose):
    prefix = tmp_path / "cont"
    summary = _preprocess(run_tool, spm_args(prefix, "--terminal-source", "continuation",
                                             "--placement", placement, "--pose-chunks", pose))
    samples, sc = _check_common(prefix, summary, n_lines=_n_lines(spm_corpus.path),
                                placement=placement, pose_chunks=pose)
    stream = np.concatenate(_doc_tokens(spm_tokenizer, spm_corpus.texts))
    n = (len(stream) - 1) // P
    assert len(samples) == n
    for i, s in enumerate(samples):  # windows of P + 1 tokens, stride P
        assert np.array_equal(s, stream[i * P: i * P + P + 1]), i
    assert np.all(np.asarray(sc.records)[:, 0] == P - B)
    assert summary["tokens_in"] == len(stream)
    assert summary["tokens_left_over_at_end"] == len(stream) - n * P
    assert summary["documents_used"] == len(spm_corpus.texts)
    assert summary["documents_skipped"] == {}
    assert sc.header.terminal_source == "continuation" and sc.header.terminal_length == B


def _expected_document_tail(docs: list[np.ndarray]) -> tuple[list[np.ndarray], int, int, int]:
    """Samples, unused middle tokens, leftover tokens and contiguous samples by the documented
    rule: a document of n >= P + 1 tokens gives doc[:a] + doc[-(b+1):]; shorter ones are
    packed into one stream cut into windows of P + 1 tokens with stride P (contiguous)."""
    a = P - B
    out, middle, stream, contiguous = [], 0, np.empty(0, np.int64), 0
    for doc in docs:
        if len(doc) >= P + 1:
            out.append(np.concatenate([doc[:a], doc[-(B + 1):]]))
            middle += len(doc) - (P + 1)
            continue
        stream = np.concatenate([stream, doc])
        while len(stream) >= P + 1:
            out.append(stream[: P + 1])
            stream = stream[P:]
            contiguous += 1
    return out, middle, len(stream), contiguous


@pytest.mark.parametrize("placement,pose", [("fixed", 1), ("random", 2)])
def test_document_tail(run_tool, spm_args, spm_corpus, spm_tokenizer, tmp_path, placement, pose):
    prefix = tmp_path / "tail"
    summary = _preprocess(run_tool, spm_args(prefix, "--terminal-source", "document-tail",
                                             "--placement", placement, "--pose-chunks", pose))
    samples, sc = _check_common(prefix, summary, n_lines=_n_lines(spm_corpus.path),
                                placement=placement, pose_chunks=pose)
    docs = _doc_tokens(spm_tokenizer, spm_corpus.texts)
    expected, middle, left, contiguous = _expected_document_tail(docs)
    assert any(len(d) < P + 1 for d in docs) and any(len(d) > P + 1 for d in docs)
    assert len(samples) == len(expected)
    for i, (s, e) in enumerate(zip(samples, expected)):
        assert np.array_equal(s, e), i
    # a document's last token (EOD) is the label of its sample's last input
    jumped = [s for s, r in zip(samples, np.asarray(sc.records))
              if not np.array_equal(positions_from_record(r, P), np.arange(P))]
    assert len(jumped) == len(samples) - contiguous
    assert all(s[-1] == spm_tokenizer.eod for s in jumped)
    assert summary["tokens_unused_middle"] == middle
    assert summary["tokens_left_over_at_end"] == left
    assert summary["samples_contiguous_positions"] == contiguous
    assert summary["tokens_in"] == ((len(samples) - contiguous) * (P + 1) + middle
                                    + contiguous * P + left)
    assert summary["documents_shorter_than_sample"] == sum(len(d) < P + 1 for d in docs)


def test_document_tail_never_mixes_documents(spm_tokenizer):
    """A jumped (EndPrompt) sample takes context and tail from ONE document (never two texts
    glued at the jump); short documents give contiguous samples. Documents are marked by their
    token values."""
    from megatron_endprompt.data.prepare.samples import SampleMaker
    from megatron_endprompt.layout import LayoutConfig

    maker = SampleMaker(LayoutConfig(seq_length=P, target_length=L),
                        terminal_source="document-tail", terminal_length=B)
    lengths = [20, 30, 25, 200, 10, 40, 50, 30, 90]
    docs = [np.full(n, 1000 + k, dtype=np.int64) for k, n in enumerate(lengths)]
    out = [s for d in docs for s in maker.add_document(d)]
    jumped = [(s, r) for s, r in out if r[1] != r[0]]
    assert len(jumped) == sum(n >= P + 1 for n in lengths) == 2
    for s, r in jumped:
        assert len(set(s.tolist())) == 1, "context and terminal from the same document"
        assert r[1] == L - B
    contiguous = [(s, r) for s, r in out if r[1] == r[0]]
    assert maker.stats.samples_contiguous == len(contiguous) == len(out) - 2 > 0
    for s, r in contiguous:
        assert np.array_equal(positions_from_record(r, P), np.arange(P))


def _check_prompt_samples(samples, sc, tok, prompt_texts, stream):
    prompts = tokenize_prompts(prompt_texts, tok)
    contexts = []
    for s, rec in zip(samples, np.asarray(sc.records)):
        a = int(rec[0])
        terminal = s[a:P]
        assert s[P] == tok.eod  # the prompt is followed by EOD as the last label
        assert any(np.array_equal(terminal, p) for p in prompts)
        contexts.append(s[:a])
    ctx = np.concatenate(contexts)  # contexts are the token stream, in order, nothing skipped
    assert np.array_equal(ctx, stream[: len(ctx)])
    return len(ctx)


def test_prompt_builtin(run_tool, spm_args, spm_corpus, spm_tokenizer, tmp_path):
    prefix = tmp_path / "prompt"
    summary = _preprocess(run_tool, spm_args(prefix, "--terminal-source", "prompt",
                                             "--terminal-prompts", "ep1-3",
                                             "--placement", "random", "--pose-chunks", 2,
                                             "--terminal-loss-weight", 0.1))
    samples, sc = _check_common(prefix, summary, n_lines=_n_lines(spm_corpus.path),
                                placement="random", pose_chunks=2)
    stream = np.concatenate(_doc_tokens(spm_tokenizer, spm_corpus.texts))
    used = _check_prompt_samples(samples, sc, spm_tokenizer, list(BUILTIN_PROMPTS), stream)
    assert summary["tokens_in"] == used + summary["tokens_left_over_at_end"]
    assert sc.header.prompts == list(BUILTIN_PROMPTS) and sc.header.terminal_length is None
    assert sc.layout.loss_weights.terminal == pytest.approx(0.1)
    counts = summary["prompt_counts"]
    assert sum(counts.values()) == len(samples)
    assert sum(v > 0 for v in counts.values()) >= 2  # prompts of different lengths are drawn
    assert len({int(r[0]) for r in np.asarray(sc.records)}) >= 2  # so a = P - len(prompt) varies


def test_prompt_user_file(run_tool, spm_args, spm_corpus, spm_tokenizer, tmp_path):
    prompts = ["Remember the pass key.", "The end.", "<eod>"]
    pfile = tmp_path / "prompts.txt"
    pfile.write_text("\n".join(prompts[:2]) + "\n\n" + prompts[2] + "\n", encoding="utf-8")
    prefix = tmp_path / "user_prompt"
    summary = _preprocess(run_tool, spm_args(prefix, "--terminal-source", "prompt",
                                             "--terminal-prompts", pfile))
    samples, sc = _check_common(prefix, summary, n_lines=_n_lines(spm_corpus.path),
                                placement="fixed", pose_chunks=1)
    assert sc.header.prompts == prompts  # blank lines ignored
    stream = np.concatenate(_doc_tokens(spm_tokenizer, spm_corpus.texts))
    _check_prompt_samples(samples, sc, spm_tokenizer, prompts, stream)
    # "<eod>" is the tokenizer's EOD token: a one-token terminal followed by EOD
    eod_samples = [s for s, r in zip(samples, np.asarray(sc.records)) if r[0] == P - 1]
    assert eod_samples and all(s[P - 1] == s[P] == spm_tokenizer.eod for s in eod_samples)
    assert sum(summary["prompt_counts"].values()) == len(samples)


# -- determinism ---------------------------------------------------------------------------
def test_workers_output_byte_identical(run_tool, spm_args, tmp_path, monkeypatch):
    import megatron_endprompt.data.tokenize.encode as pp

    monkeypatch.setattr(pp, "_BATCH_LINES", 3)  # many batches, so both workers get work
    flags = ("--terminal-source", "prompt", "--placement", "random", "--pose-chunks", 2)
    _preprocess(run_tool, spm_args(tmp_path / "w1", *flags, "--workers", 1))
    _preprocess(run_tool, spm_args(tmp_path / "w2", *flags, "--workers", 2))
    assert _files(str(tmp_path / "w1")) == _files(str(tmp_path / "w2"))


def test_seed_determinism(run_tool, spm_args, tmp_path):
    flags = ("--placement", "random", "--pose-chunks", 2)
    _preprocess(run_tool, spm_args(tmp_path / "a", *flags, "--seed", 5))
    _preprocess(run_tool, spm_args(tmp_path / "b", *flags, "--seed", 5))
    _preprocess(run_tool, spm_args(tmp_path / "c", *flags, "--seed", 6))
    a, b, c = (_files(str(tmp_path / x)) for x in "abc")
    assert a == b  # same seed: identical files
    assert c[".bin"] == a[".bin"] and c[".idx"] == a[".idx"]  # tokens do not depend on the seed
    assert c[".endprompt"] != a[".endprompt"]
    ra = np.asarray(read_sidecar(str(tmp_path / "a.endprompt")).records)
    rc_ = np.asarray(read_sidecar(str(tmp_path / "c.endprompt")).records)
    assert not np.array_equal(ra, rc_)  # different seed, random placement: other layouts


# -- inputs --------------------------------------------------------------------------------
def test_glob_input_equals_single_file(run_tool, spm_args, spm_corpus, tmp_path):
    with open(spm_corpus.path, encoding="utf-8") as f:
        lines = f.readlines()
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "part-0.jsonl").write_text("".join(lines[:17]), encoding="utf-8")
    (parts / "part-1.jsonl").write_text("".join(lines[17:]), encoding="utf-8")
    summary = _preprocess(run_tool, spm_args(tmp_path / "globbed",
                                             inputs=[str(parts / "part-*.jsonl")]))
    _preprocess(run_tool, spm_args(tmp_path / "single"))
    assert summary["documents_read"] == len(lines)
    assert _files(str(tmp_path / "globbed")) == _files(str(tmp_path / "single"))


@pytest.mark.parametrize("source", ["continuation", "document-tail", "prompt"])
def test_short_documents_are_packed_not_dropped(run_tool, spm_args, spm_tokenizer, tmp_path,
                                                source):
    texts = [f"Short note {i}: the grey horse crosses the bridge." for i in range(30)]
    corpus = tmp_path / "short.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    docs = _doc_tokens(spm_tokenizer, texts)
    assert all(len(d) < P + 1 for d in docs)
    prefix = tmp_path / "short"
    summary = _preprocess(run_tool, spm_args(prefix, "--terminal-source", source,
                                             inputs=[str(corpus)]))
    samples, sc = _check_common(prefix, summary, n_lines=len(texts), placement="fixed",
                                pose_chunks=1)
    total = sum(map(len, docs))
    assert summary["documents_shorter_than_sample"] == len(texts) == summary["documents_used"]
    assert summary["tokens_in"] == total
    stream = np.concatenate(docs)
    if source == "continuation":
        assert total == len(samples) * P + summary["tokens_left_over_at_end"]
        assert np.array_equal(np.concatenate([s[:P] for s in samples]), stream[: len(samples) * P])
    elif source == "document-tail":
        expected, middle, left, contiguous = _expected_document_tail(docs)
        assert [s.tolist() for s in samples] == [e.tolist() for e in expected]
        assert contiguous == len(samples) and middle == 0
        assert total == len(samples) * P + left
        assert summary["tokens_unused_middle"] == middle
    else:
        used = _check_prompt_samples(samples, sc, spm_tokenizer, list(BUILTIN_PROMPTS), stream)
        assert total == used + summary["tokens_left_over_at_end"]
    assert summary["tokens_left_over_at_end"] < P + 1


# -- inspect -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pose_prefix(spm_args, tmp_path_factory):
    """A prompt / random / PoSE dataset (the most varied layouts), built once."""
    from megatron_endprompt.errors import run_cli

    prefix = str(tmp_path_factory.mktemp("inspect") / "pose")
    assert run_cli(preprocess_cli.main, spm_args(
        prefix, "--terminal-source", "prompt", "--terminal-prompts", "ep1-3",
        "--placement", "random", "--pose-chunks", 3,
        "--terminal-loss-weight", 0.25, "--context-loss-weight", 0.5)) == 0
    return prefix


def test_inspect_json_matches_layout(run_tool, pose_prefix, spm_tokenizer):
    samples, sc = _read(pose_prefix)
    n = len(samples)
    for index in (0, n // 2, n - 1):
        rc, out, err = run_tool(inspect_cli.main, [pose_prefix, "--index", index, "--json"])
        assert rc == 0, err
        doc = json.loads(out)
        stats, sample = doc["stats"], doc["sample"]
        rec = np.asarray(sc.records[index])
        assert stats["samples"] == n
        assert stats["bin_bytes"] == os.path.getsize(pose_prefix + ".bin")
        assert stats["sidecar_bytes"] == os.path.getsize(pose_prefix + ".endprompt")
        assert stats["terminal_source"] == "prompt" and stats["layout"]["pose_chunks"] == 3
        assert stats["preprocessing"]["samples_written"] == n
        assert sample["index"] == index
        assert sample["context_length"] == int(rec[0])
        assert sample["terminal_length"] == P - int(rec[0])
        assert sample["tokens"] == samples[index][:P].tolist()
        assert sample["labels"] == samples[index][1:].tolist()
        assert samples[index][P] == spm_tokenizer.eod
        assert sample["position_ids"] == positions_from_record(rec, P).tolist()
        weights = loss_weights_from_record(rec, P, LossWeights(terminal=0.25, context=0.5),
                                           predict_after_terminal=False)  # a prompt terminal
        assert sample["loss_mask"] == pytest.approx(weights.tolist())
        assert [(r["token_offset"], r["first_position"], r["length"]) for r in sample["runs"]] \
            == describe_runs(rec, P)
        assert len(sample["runs"]) == 4  # 3 context pieces + the terminal
        # the tokenizer recorded in the sidecar is found and used to detokenize
        a = int(rec[0])
        assert sample["context_text"] == spm_tokenizer.detokenize(samples[index][:a].tolist())
        assert sample["terminal_text"] == spm_tokenizer.detokenize(samples[index][a:P].tolist())


def test_inspect_text_output(run_tool, pose_prefix):
    samples, sc = _read(pose_prefix)
    for index in range(len(samples)):
        a = int(sc.records[index][0])
        if P - a < 16:  # a short prompt terminal: the whole terminal is listed
            break
    rc, out, err = run_tool(inspect_cli.main, [pose_prefix, "--index", index])
    assert rc == 0 and err == ""
    assert "pose_chunks=3" in out and "position_ids:" in out and "loss weights:" in out
    assert f"sample {index}: context a={a}, terminal b={P - a}" in out
    # the terminal tokens listed are the sample's inputs a..P-1, not the label after them
    line = next(x for x in out.splitlines() if "terminal tokens[:16]:" in x)
    assert line.split("terminal tokens[:16]: ")[1] == str(samples[index][a:P].tolist())


@pytest.mark.process
def test_inspect_tool_subprocess_succeeds(pose_prefix):
    """The real script (a fresh interpreter, as a user runs it): exit 0, JSON on stdout, no
    traceback. (tests/data/prepare/test_bad_input.py runs tools/preprocess_endprompt.py failing.)"""
    ins = subprocess.run([sys.executable, os.path.join(REPO, "tools", "inspect_endprompt.py"),
                          pose_prefix, "--index", "2", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert ins.returncode == 0, ins.stderr
    assert "Traceback" not in ins.stderr and "error" not in ins.stderr
    assert json.loads(ins.stdout)["sample"]["index"] == 2
