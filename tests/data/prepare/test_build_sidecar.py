"""Sidecars for an existing Megatron corpus (tokenized once, never rewritten): built from the .idx,
the .bin/.idx untouched, samples composed at read time equal to cutting the tokens directly."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

from megatron_endprompt.cli import build_sidecar as cli
from megatron_endprompt.data.dataset import EndPromptDatasetConfig, EndPromptGPTDataset
from megatron_endprompt.data.prepare.samples import SampleMaker
from megatron_endprompt.data.sidecar.sidecar import read_sidecar
from megatron_endprompt.data.sidecar.spans import sidecar_pieces, span_reader
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer
from megatron_endprompt.layout import LayoutConfig

P, L, B, VOCAB = 32, 256, 8, 1000


def _sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def write_corpus(prefix, n_docs=90, seed=0, eod=None):
    """A corpus as Megatron's IndexedDatasetBuilder writes it (some documents of two
    sequences, as --split-sentences makes); returns the documents' tokens."""
    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    docs = []
    for _ in range(n_docs):
        doc = rng.integers(0, VOCAB - 1, int(rng.integers(3, 80)))
        if eod is not None:
            doc = np.append(doc, eod)
        cut = len(doc) // 2 if rng.random() < 0.3 and len(doc) > 3 else len(doc)
        lengths = [cut, len(doc) - cut] if cut < len(doc) else [len(doc)]
        builder.add_document(doc, lengths)
        docs.append(doc)
    builder.finalize(prefix + ".idx")
    return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("corpus") / "megatron")
    docs = write_corpus(prefix)
    return prefix, docs


def _argv(prefix, *extra):
    return ["--data-prefix", prefix, "--seq-length", P, "--target-length", L,
            "--terminal-length", B, "--no-progress", *extra]


def _expected(docs, layout, seed, **kw):
    maker = SampleMaker(layout, seed=seed, **kw)
    out = [s for d in docs for s in maker.add_document(d.astype(np.int64))]
    return out


@pytest.mark.parametrize("source,placement,chunks", [("continuation", "random", 2),
                                                     ("document-tail", "fixed", 1)])
def test_sidecar_for_existing_corpus_leaves_data_untouched(corpus, run_tool, source, placement,
                                                            chunks):
    prefix, docs = corpus
    before = {s: _sha(prefix + s) for s in (".bin", ".idx")}
    name = f"{source}-{placement}"
    rc, out, err = run_tool(cli.main, _argv(prefix, "--terminal-source", source, "--placement",
                                            placement, "--pose-chunks", chunks, "--seed", 5,
                                            "--name", name))
    assert rc == 0, err
    assert {s: _sha(prefix + s) for s in (".bin", ".idx")} == before
    sc = read_sidecar(f"{prefix}.{name}.endprompt", prefix=prefix)
    layout = LayoutConfig(seq_length=P, target_length=L, placement=placement, pose_chunks=chunks)
    expected = _expected(docs, layout, 5, terminal_source=source, terminal_length=B)
    assert sc.header.num_samples == len(expected) > 5
    reader = span_reader(prefix, sc, np.uint16)
    for i, (tokens, record) in enumerate(expected):
        assert np.array_equal(reader.tokens(i), tokens)
        assert np.array_equal(sc.records[i], record)


def test_prompt_terminals_composed_at_read_time(corpus, run_tool, tmp_path):
    prefix, docs = corpus
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("11 12 13\n<eod>\n7 8 9 10 11\n")
    rc, _, err = run_tool(cli.main, _argv(prefix, "--terminal-source", "prompt",
                                          "--terminal-prompts", prompts, "--tokenizer-type",
                                          "NullTokenizer", "--vocab-size", VOCAB, "--name", "p"))
    assert rc == 0, err
    tok = build_tokenizer(TokenizerSpec(tokenizer_type="NullTokenizer", vocab_size=VOCAB))
    sc = read_sidecar(f"{prefix}.p.endprompt", prefix=prefix)
    layout = LayoutConfig(seq_length=P, target_length=L)
    plist = [np.array([11, 12, 13]), np.array([tok.eod]), np.array([7, 8, 9, 10, 11])]
    expected = _expected(docs, layout, 1234, terminal_source="prompt", terminal_length=None,
                         prompts=plist, eod=tok.eod)
    reader = span_reader(prefix, sc, np.uint16)
    assert len(expected) == sc.header.num_samples
    _, pieces = sidecar_pieces(sc)
    assert set(pieces[pieces[:, 0] < 0, 0].tolist()) == {-1, -2, -3, -4}  # EOD + 3 prompts
    for i, (tokens, record) in enumerate(expected):
        assert np.array_equal(reader.tokens(i), tokens)
        assert np.array_equal(sc.records[i], record)


def test_corpus_sidecar_trains_through_dataset(corpus, run_tool, tmp_path):
    """The Megatron-made corpus with its sidecar goes through BlendedMegatronDatasetBuilder;
    every sample's tokens are the span composition, and no sample crosses a split boundary."""
    prefix, _ = corpus
    rc, _, err = run_tool(cli.main, _argv(prefix, "--placement", "random", "--seed", 3))
    assert rc == 0, err
    tok = build_tokenizer(TokenizerSpec(tokenizer_type="NullTokenizer", vocab_size=VOCAB))
    config = EndPromptDatasetConfig(
        random_seed=1234, sequence_length=P, blend=([prefix], [1.0]), split="80,10,10",
        tokenizer=tok, reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, create_attention_mask=False, path_to_cache=str(tmp_path / "cache"),
        endprompt_target_length=L)
    train, valid, test = BlendedMegatronDatasetBuilder(EndPromptGPTDataset, [40, 4, 4],
                                                       lambda: True, config).build()
    sc = read_sidecar(prefix + ".endprompt")
    reader = span_reader(prefix, sc, np.uint16)
    used = []
    for ds in (train, valid, test):
        inner = getattr(ds, "datasets", [ds])[0]
        assert inner.sidecar.sources is not None
        for i in range(len(inner)):
            s = inner[i]
            k = int(inner.document_index[i])
            assert np.array_equal(s["tokens"].numpy(), reader.tokens(k)[:P].astype(np.int64))
            assert s["position_ids"].max() < L
        used.append(set(np.asarray(inner.document_index).tolist()))
    assert not (used[0] & used[1]) and not (used[0] & used[2]) and not (used[1] & used[2])
    assert IndexedDataset(prefix).sequence_lengths.sum() > 0


def test_not_a_corpus_is_one_error_line(run_tool, tmp_path):
    rc, _, err = run_tool(cli.main, _argv(str(tmp_path / "nope")))
    assert rc == 2 and err.startswith("error: --data-prefix") and err.count("\n") == 1


def test_tokenized_corpus_as_input_points_to_the_sidecar_tool(corpus, spm_args, run_tool):
    from megatron_endprompt.cli import preprocess as preprocess_cli

    prefix, _ = corpus
    rc, _, err = run_tool(preprocess_cli.main, spm_args(prefix + "_out", inputs=[prefix + ".bin"]))
    assert rc == 2 and err.count("\n") == 1 and "build_endprompt_sidecar.py" in err
