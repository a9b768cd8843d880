"""EndPromptGPTDataset through Megatron's BlendedMegatronDatasetBuilder."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

from megatron_endprompt.data.dataset import EndPromptDatasetConfig, EndPromptGPTDataset
from megatron_endprompt.data.prepare.preprocess import PreprocessOptions, preprocess
from megatron_endprompt.data.sidecar.terminal_spec import TerminalSpec
from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
from megatron_endprompt.data.sidecar.spans import sample_reader
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer
from megatron_endprompt.errors import UserError
from megatron_endprompt.layout import LayoutConfig, positions_from_record
from megatron_endprompt.loss_weights import LossWeights

P, L, B, VOCAB = 32, 256, 8, 1000
SPEC = TokenizerSpec(tokenizer_type="NullTokenizer", vocab_size=VOCAB)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(SPEC)


def _corpus(path, n_docs=120, seed=0):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(n_docs):
            ids = rng.integers(0, VOCAB - 1, int(rng.integers(5, 90)))
            f.write(json.dumps({"text": " ".join(map(str, ids))}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    corpus = _corpus(root / "c.jsonl")
    ep = str(root / "ep")
    preprocess(PreprocessOptions(
        inputs=[corpus], output_prefix=ep, tokenizer=SPEC, append_eod=True, progress=False,
        layout=LayoutConfig(seq_length=P, target_length=L, placement="random", pose_chunks=2,
                            loss_weights=LossWeights(terminal=0.25, context=1.0)),
        terminal=TerminalSpec(source="continuation", length=B, seed=7)))
    plain = str(root / "plain")
    rng = np.random.default_rng(1)
    builder = IndexedDatasetBuilder(plain + ".bin", dtype=np.uint16)
    for _ in range(80):
        doc = rng.integers(0, VOCAB - 1, int(rng.integers(10, 70)))
        builder.add_document(doc, [len(doc)])
    builder.finalize(plain + ".idx")
    return dict(root=root, ep=ep, plain=plain)


def _config(tok, blend, cache, **kw):
    base = dict(random_seed=1234, sequence_length=P, blend=blend, split="80,10,10", tokenizer=tok,
                reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
                create_attention_mask=False, path_to_cache=str(cache), endprompt_target_length=L)
    base.update(kw)
    return EndPromptDatasetConfig(**base)


def _build(config, sizes=(200, 20, 20)):
    return BlendedMegatronDatasetBuilder(EndPromptGPTDataset, list(sizes), lambda: True,
                                         config).build()


def _endprompt_parts(blended):
    """The per-prefix datasets of a built split."""
    return list(getattr(blended, "datasets", [blended]))


def test_sample_matches_stored_data_and_sidecar(tok, data, tmp_path):
    train, valid, test = _build(_config(tok, ([data["ep"]], [1.0]), tmp_path / "cache"))
    inner = _endprompt_parts(train)[0]
    assert isinstance(inner, EndPromptGPTDataset) and inner.sidecar is not None
    sc = read_sidecar(sidecar_path(data["ep"]))
    stored = sample_reader(data["ep"], sc)
    for i in range(0, len(inner), 17):
        s = inner[i]
        doc = int(inner.document_index[i])
        text = stored(doc).astype(np.int64)
        assert set(s) == {"tokens", "labels", "loss_mask", "position_ids", "terminal_mask"}
        assert s["tokens"].dtype == torch.int64 and s["labels"].dtype == torch.int64
        assert s["loss_mask"].dtype == torch.float32 and s["position_ids"].dtype == torch.int64
        assert torch.equal(s["tokens"], torch.from_numpy(text[:P]))
        assert torch.equal(s["labels"], torch.from_numpy(text[1:]))
        assert torch.equal(s["position_ids"],
                           torch.from_numpy(positions_from_record(sc.records[doc], P)))
        a = int(sc.records[doc][0])
        lm = s["loss_mask"].numpy()
        assert np.all(lm[: a - 1] == 1.0) and np.all(lm[a - 1:] == 0.25)
        assert s["terminal_mask"].tolist() == [0.0] * (a - 1) + [1.0] * (P - a + 1)
        assert s["position_ids"].max() < L


def test_keys_and_dtypes_equal_gptdataset(tok, data, tmp_path):
    for create_mask in (False, True):
        gcfg = GPTDatasetConfig(random_seed=1, sequence_length=P, blend=([data["plain"]], [1.0]),
                                split="100,0,0", tokenizer=tok, reset_position_ids=False,
                                reset_attention_mask=False, eod_mask_loss=False,
                                create_attention_mask=create_mask,
                                path_to_cache=str(tmp_path / "g"))
        ref = BlendedMegatronDatasetBuilder(GPTDataset, [10, 0, 0], lambda: True,
                                           gcfg).build()[0][0]
        ours = _build(_config(tok, ([data["ep"]], [1.0]), tmp_path / "e",
                              create_attention_mask=create_mask), (10, 0, 0))[0][0]
        assert set(ours) - {"dataset_id"} == (set(ref) - {"dataset_id"}) | {"terminal_mask"}
        assert ours["terminal_mask"].dtype == torch.float32
        assert ours["terminal_mask"].shape == ref["loss_mask"].shape
        for k in ref:
            if k != "dataset_id":
                assert ours[k].dtype == ref[k].dtype and ours[k].shape == ref[k].shape, k
        if create_mask:
            assert torch.equal(ours["attention_mask"], ref["attention_mask"])


def test_blend_with_plain_replay_prefix(tok, data, tmp_path):
    train, _, _ = _build(_config(tok, ([data["ep"], data["plain"]], [0.5, 0.5]), tmp_path / "c",
                                 endprompt_replay_prefixes=[data["plain"]]))
    parts = _endprompt_parts(train)
    assert parts[0].sidecar is not None and parts[1].sidecar is None
    seen, jumped = set(), 0
    for i in range(len(train)):
        s = train[i]
        ds_id = int(s["dataset_id"])
        seen.add(ds_id)
        if ds_id == 1:  # plain data: contiguous positions, weight 1
            assert torch.equal(s["position_ids"], torch.arange(P))
            assert torch.all(s["loss_mask"] == 1.0)
        else:
            jumped += int(s["position_ids"].max() > P)
    assert seen == {0, 1} and jumped > 10


def test_split_is_disjoint_and_covers(tok, data, tmp_path):
    splits = _build(_config(tok, ([data["ep"]], [1.0]), tmp_path / "c"))
    docs = [set(np.asarray(_endprompt_parts(s)[0].indices).tolist()) for s in splits]
    assert not (docs[0] & docs[1]) and not (docs[0] & docs[2]) and not (docs[1] & docs[2])
    n = len(IndexedDataset(data["ep"]).sequence_lengths)
    assert sum(map(len, docs)) == n
    # samples (spans of the tokenized documents) are drawn inside their split only
    samples = [set(np.asarray(_endprompt_parts(s)[0].document_index).tolist()) for s in splits]
    assert not (samples[0] & samples[1]) and not (samples[1] & samples[2])
    assert samples[1] and samples[1] <= set(_endprompt_parts(splits[1])[0]._units.tolist())


def test_deterministic_under_seed_and_epochs(tok, data, tmp_path):
    a = _build(_config(tok, ([data["ep"]], [1.0]), tmp_path / "a"))[0]
    b = _build(_config(tok, ([data["ep"]], [1.0]), tmp_path / "b"))[0]
    c = _build(_config(tok, ([data["ep"]], [1.0]), tmp_path / "c", random_seed=99))[0]
    order = lambda ds: [int(_endprompt_parts(ds)[0].document_index[i]) for i in range(len(ds))]  # noqa: E731
    assert order(a) == order(b)
    assert order(a) != order(c)
    for i in range(0, len(a), 13):
        for k in ("tokens", "labels", "loss_mask", "position_ids"):
            assert torch.equal(a[i][k], b[i][k])
    # more samples than one epoch: whole epochs, every train document used evenly
    inner = _endprompt_parts(a)[0]
    n_docs = len(inner.indices)
    assert 200 > n_docs and len(inner) >= 200
    counts = np.bincount(np.asarray(inner.document_index), minlength=int(max(inner.indices)) + 1)
    used = counts[np.asarray(inner.indices)]
    assert used.min() >= 200 // n_docs - 1 and used.max() <= -(-200 // n_docs) + 1


def test_cache_is_reused_and_keyed_by_endprompt_params(tok, data, tmp_path):
    cache = tmp_path / "cache"
    _build(_config(tok, ([data["ep"]], [1.0]), cache))
    files = set(os.listdir(cache))
    _build(_config(tok, ([data["ep"]], [1.0]), cache))
    assert set(os.listdir(cache)) == files, "second build hits the cache"
    _build(_config(tok, ([data["ep"]], [1.0]), cache,
                   endprompt_loss_weights=LossWeights(terminal=0.5)))
    assert set(os.listdir(cache)) > files, "EndPrompt parameters are part of the cache key"


def test_training_flags_checked_against_sidecar(tok, data, tmp_path):
    with pytest.raises(UserError, match="L=256.*--endprompt-target-length 512") as info:
        _build(_config(tok, ([data["ep"]], [1.0]), tmp_path / "c", endprompt_target_length=512))
    assert sidecar_path(data["ep"]) in str(info.value)
    with pytest.raises(UserError, match="--seq-length 32 but training uses --seq-length 64"):
        _build(_config(tok, ([data["ep"]], [1.0]), tmp_path / "c", sequence_length=64))
    with pytest.raises(UserError, match="reset-position-ids"):
        _build(_config(tok, ([data["ep"]], [1.0]), tmp_path / "c", reset_position_ids=True))
    with pytest.raises(UserError, match="no EndPrompt sidecar"):
        _build(_config(tok, ([data["plain"]], [1.0]), tmp_path / "c"))


def test_prefix_without_sidecar_is_refused_unless_listed_as_replay(tok, data, tmp_path):
    """No dataset becomes replay by accident: a prefix without a sidecar must be listed."""
    with pytest.raises(UserError) as info:
        _build(_config(tok, ([data["ep"], data["plain"]], [0.5, 0.5]), tmp_path / "c"))
    msg = str(info.value)
    assert "\n" not in msg and data["plain"] + ".endprompt" in msg
    assert "--endprompt-replay-prefixes" in msg
    # listed (any spelling of the same path): plain GPTDataset packing
    rel = os.path.relpath(data["plain"])
    train = _build(_config(tok, ([data["plain"]], [1.0]), tmp_path / "c",
                           endprompt_replay_prefixes=[rel]))[0]
    assert _endprompt_parts(train)[0].sidecar is None
    # an EndPrompt prefix listed as replay is trained as replay data
    train = _build(_config(tok, ([data["ep"]], [1.0]), tmp_path / "d",
                           endprompt_replay_prefixes=[data["ep"]]))[0]
    assert _endprompt_parts(train)[0].sidecar is None
    assert torch.equal(train[0]["position_ids"], torch.arange(P))


def test_named_sidecars_side_by_side(tok, data, tmp_path):
    """PREFIX.NAME.endprompt picked by endprompt_sidecar_name; part of the cache key."""
    import shutil

    prefix = str(tmp_path / "ep")
    for ext in (".bin", ".idx"):
        shutil.copyfile(data["ep"] + ext, prefix + ext)
    shutil.copyfile(sidecar_path(data["ep"]), sidecar_path(prefix, "L256"))
    cache = tmp_path / "cache"
    with pytest.raises(UserError, match=r"ep\.endprompt.*--endprompt-replay-prefixes"):
        _build(_config(tok, ([prefix], [1.0]), cache))  # the default name is absent
    named = _build(_config(tok, ([prefix], [1.0]), cache, endprompt_sidecar_name="L256"))[0]
    assert _endprompt_parts(named)[0].sidecar.path == sidecar_path(prefix, "L256")
    files = set(os.listdir(cache))
    shutil.copyfile(sidecar_path(data["ep"]), sidecar_path(prefix, "other"))
    _build(_config(tok, ([prefix], [1.0]), cache, endprompt_sidecar_name="other"))
    assert {f for f in set(os.listdir(cache)) - files if f.endswith("sample_index.npy")}, \
        "the sidecar name is part of the index-cache key"
    with pytest.raises(UserError, match="ep.missing.endprompt"):
        _build(_config(tok, ([prefix], [1.0]), cache, endprompt_sidecar_name="missing"))


def test_tokenizer_mismatch_is_refused_naming_both(data, tmp_path):
    """Data made with another tokenizer must not train (its ids mean other tokens)."""
    other = build_tokenizer(TokenizerSpec(tokenizer_type="NullTokenizer", vocab_size=VOCAB + 12))
    with pytest.raises(UserError) as info:
        _build(_config(other, ([data["ep"]], [1.0]), tmp_path / "c"))
    msg = str(info.value)
    assert sidecar_path(data["ep"]) in msg and "made with tokenizer" in msg
    assert f"vocab {VOCAB}," in msg and f"vocab {VOCAB + 12}," in msg, msg


def test_replay_prefix_rewritten_is_not_served_a_stale_index(tok, tmp_path):
    """Megatron's cache key ignores file contents: a replay prefix rewritten from 50 to 480
    documents reused the 50-document index."""
    prefix = str(tmp_path / "replay")

    def write(n_docs):
        builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
        for i in range(n_docs):
            builder.add_document(np.full(40, i % 900, dtype=np.int64), [40])
        builder.finalize(prefix + ".idx")

    cfg = lambda: _config(tok, ([prefix], [1.0]), tmp_path / "cache", split="100,0,0",  # noqa: E731
                          endprompt_replay_prefixes=[prefix])
    write(50)
    small = _build(cfg(), (10, 0, 0))[0]
    write(480)
    big = _build(cfg(), (10, 0, 0))[0]
    n_small = int(_endprompt_parts(small)[0].document_index.max())
    n_big = int(_endprompt_parts(big)[0].document_index.max())
    assert n_small < 50 <= n_big, (n_small, n_big)
    write(50)  # and back: 480 -> 50 must not crash on the 480-document index
    again = _build(cfg(), (10, 0, 0))[0]
    assert int(_endprompt_parts(again)[0].document_index.max()) < 50
    for i in range(len(again)):
        again[i]


def test_megatron_conventions_eod_padding_and_overrides(tok, data, tmp_path):
    cfg = _config(tok, ([data["ep"]], [1.0]), tmp_path / "c", eod_mask_loss=True,
                  endprompt_loss_weights=LossWeights(terminal=0.5, context=0.0),
                  create_attention_mask=True)
    inner = _endprompt_parts(_build(cfg)[0])[0]
    hits = 0
    for i in range(len(inner)):
        s = inner[i]
        eod = s["tokens"] == tok.eod
        hits += int(eod.any())
        assert torch.all(s["loss_mask"][eod] == 0)
        assert set(s["loss_mask"][~eod].tolist()) <= {0.0, 0.5}
        assert s["attention_mask"].shape == (1, P, P) and s["attention_mask"].dtype == torch.bool
    assert hits > 0
    assert torch.all(inner[None]["loss_mask"] == 0), "batch-padding sample carries no loss"
    no_extra = _endprompt_parts(_build(_config(tok, ([data["ep"]], [1.0]), tmp_path / "d",
                                               add_extra_token_to_sequence=False))[0])[0]
    s = no_extra[0]
    assert s["loss_mask"][-1] == 0 and s["labels"][-1] == 0
    assert torch.equal(s["labels"][:-1], s["tokens"][1:])


def test_startup_tokenizer_identity_is_used_not_recomputed(tok, data, tmp_path, monkeypatch):
    """The identity pretrain computed once at start-up reaches the datasets: they check it
    (a wrong one is refused though the config's tokenizer matches) and fingerprint nothing."""
    from megatron_endprompt.data.tokenize import tokenizer_identity as ti

    startup = ti.tokenizer_identity(tok, tokenizer_type="NullTokenizer")
    monkeypatch.setattr(ti, "vocab_fingerprint", lambda t: pytest.fail("fingerprinted again"))
    fresh = build_tokenizer(SPEC)  # no memo on this object: a recomputation would show
    _build(_config(fresh, ([data["ep"]], [1.0]), tmp_path / "a",
                   endprompt_tokenizer_identity=startup))
    wrong = dataclasses.replace(startup, vocab_size=VOCAB + 1)
    with pytest.raises(UserError, match="made with tokenizer"):
        _build(_config(fresh, ([data["ep"]], [1.0]), tmp_path / "b",
                       endprompt_tokenizer_identity=wrong))
