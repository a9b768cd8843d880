"""Long-context validation inside Megatron's real ``pretrain`` (CPU, gloo, torchrun): under
TP=2 and PP=2 the values reach TensorBoard event files, and ``long-eval/ppl@L`` equals the
offline tool's per-document PPL of the exported model. Flag errors are one line."""

from __future__ import annotations

import argparse
import json
import os
import random
import re

import pytest

from megatron_endprompt.training.long_eval import LongEvaluator as _LongEvaluator
from megatron_endprompt.training.long_eval import add_long_eval_args
from megatron_endprompt.training.run import long_eval_settings

SEQ, TARGET, LENGTHS = 128, 512, (256, 512)
_LINE = re.compile(r"long-eval at iteration (\d+) \| (.*)")


def _evaluator(args):
    """The evaluator as ``pretrain.main`` builds it: from the settings read once."""
    return _LongEvaluator(long_eval_settings(args), args)


def _args(**over):
    p = argparse.ArgumentParser()
    add_long_eval_args(p)
    ns = p.parse_args([])
    ns.endprompt_long_eval_interval = 4
    ns.endprompt_long_eval_data = None
    ns.endprompt_long_eval_tasks = "passkey"
    ns.eval_interval, ns.eval_iters, ns.seed, ns.endprompt_target_length = 2, 1, 1, 1024
    for k, v in over.items():
        setattr(ns, k, v)
    return ns


@pytest.mark.parametrize("over, needle", [
    ({"endprompt_long_eval_interval": 3}, "multiple of --eval-interval 2"),
    ({"eval_iters": 0}, "--eval-iters > 0"),
    ({"endprompt_long_eval_lengths": "512,4096"}, "each length must be in [16"),
    ({"endprompt_long_eval_lengths": "5k"}, "give integers"),
    ({"endprompt_long_eval_tasks": "ppl,niah"}, "unknown ['niah']"),
    ({"endprompt_long_eval_tasks": "ppl"}, "needs --endprompt-long-eval-data"),
    ({"endprompt_long_eval_data": "/nonexistent/x.jsonl"}, "no such file or prefix"),
])
def test_flag_errors(over, needle):
    with pytest.raises(ValueError) as exc:
        _evaluator(_args(**over))
    assert needle in str(exc.value)
    assert _evaluator(_args()).lengths == [1024]  # default: the target length


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A SentencePiece tokenizer, an EndPrompt prefix and two held-out long documents."""
    from megatron_endprompt.cli import preprocess
    from megatron_endprompt.data.prepare.synthetic import train_sentencepiece, write_corpus
    from megatron_endprompt.errors import run_cli

    root = tmp_path_factory.mktemp("long_eval")
    corpus = write_corpus(str(root / "corpus.jsonl"), num_docs=120, seed=0)
    spm = train_sentencepiece(corpus, str(root / "tokenizer"), vocab_size=512)
    assert run_cli(preprocess.main, [
        "--input", corpus, "--tokenizer-type", "GPTSentencePieceTokenizer",
        "--tokenizer-model", spm, "--seq-length", str(SEQ), "--target-length", str(TARGET),
        "--append-eod", "--workers", "1", "--no-progress", "--output-prefix",
        str(root / "pre"), "--terminal-source", "continuation", "--terminal-length", "16",
        "--placement", "fixed"]) == 0
    texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
    held = root / "held.jsonl"
    with open(held, "w", encoding="utf-8") as f:
        for i in range(2):
            f.write(json.dumps({"text": " ".join(texts[100 + 10 * i:110 + 10 * i])}) + "\n")
    return {"root": root, "spm": spm, "prefix": str(root / "pre"), "held": str(held)}


def _train(data, layout):
    from megatron_endprompt.demo_train import train_tiny

    work = data["root"] / layout
    work.mkdir()
    train_tiny(workdir=str(work), tokenizer_model=data["spm"], data_prefixes=[data["prefix"]],
               seq_length=SEQ, target_length=TARGET, train_iters=2, parallel=layout,
               extra=["--lr-warmup-iters", "1", "--eval-interval", "2", "--eval-iters", "1",
                      "--tensorboard-dir",
                      str(work / "tb"), "--endprompt-long-eval-interval", "2",
                      "--endprompt-long-eval-lengths", ",".join(map(str, LENGTHS)),
                      "--endprompt-long-eval-tasks", "ppl,passkey",
                      "--endprompt-long-eval-data", data["held"],
                      "--endprompt-long-eval-samples", "2"])
    log = (work / "train.log").read_text()
    lines = _LINE.findall(log)
    assert [int(i) for i, _ in lines] == [2], log[-3000:]  # once, at the validation
    console = {k: float(v) for k, v in re.findall(r"(\w+@\d+) ([0-9.e+-]+)", lines[0][1])}
    return work, console


def _scalars(tb_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]
            if t.startswith("long-eval/")}


@pytest.mark.process
@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_long_eval_in_pretrain(data, layout):
    pytest.importorskip("tensorboard", reason="reading event files needs tensorboard "
                        "(requirements-dev.txt)")
    work, console = _train(data, layout)
    keys = {f"{t}@{n}" for t in ("ppl", "passkey") for n in LENGTHS}
    assert set(console) == keys
    scalars = _scalars(work / "tb")
    assert set(scalars) == {f"long-eval/{k}" for k in keys}
    for k, v in console.items():
        (step, value), = scalars[f"long-eval/{k}"]
        assert step == 2 and value == pytest.approx(v, rel=1e-6)
        if k.startswith("ppl"):
            assert 1.0 < v < 600  # about the vocabulary size after two steps
        else:
            assert v in (0.0, 0.5, 1.0)
    if layout == "tp2":
        _offline_ppl_matches(data, work, console)


def _offline_ppl_matches(data, work, console):
    """The exported model's PPL from the offline tool (per document, BOS, one window of L
    tokens per document) equals the in-training value."""
    from megatron_endprompt.cli import convert
    from megatron_endprompt.errors import run_cli
    from megatron_endprompt.evaluation import suite

    hf = str(work / "hf")
    assert run_cli(convert.main, ["megatron-to-hf", "--checkpoint", str(work / "checkpoints"),
                                  "--output", hf, "--no-progress"]) == 0
    for n in LENGTHS:
        res = suite.run_eval(suite.EvalConfig(
            hf_dir=hf, output=str(work / f"offline_{n}.json"), lengths=[n], tasks=["ppl"],
            ppl_data=data["held"], ppl_doc_tokens=n, progress=False), log=lambda m: None)
        got = res["ppl"]["by_length"][str(n)]
        assert got["docs"] == 2 and got["tokens"] == 2 * (n - 1)
        assert got["ppl"] == pytest.approx(console[f"ppl@{n}"], rel=2e-5)
    assert os.path.isfile(os.path.join(hf, "config.json"))


class _Tok:
    """A word-level stand-in for Megatron tokenizers: ``adds_bos`` as Megatron's HF tokenizer
    (BOS put before every tokenized text), else as SentencePiece (none)."""

    bos, vocab_size = 1, 1000

    def __init__(self, adds_bos):
        self.adds_bos = adds_bos

    def tokenize(self, text):
        ids = [2 + (hash(w) % 900) for w in text.split(" ") if w]
        return [self.bos] + ids if self.adds_bos else ids


@pytest.mark.parametrize("adds_bos", [True, False])
def test_one_bos_whatever_the_tokenizer(tmp_path, monkeypatch, adds_bos):
    """Documents and passkey prompts start with exactly one BOS, fit the length, and the
    answer is the key."""
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"text": "word " * 300}) + "\n", encoding="utf-8")
    ev = _evaluator(_args(endprompt_long_eval_tasks="ppl,passkey",
                             endprompt_long_eval_data=str(held),
                             endprompt_long_eval_samples=3))
    tok = _Tok(adds_bos)
    monkeypatch.setattr(ev, "_tokenizer", lambda: tok)
    (doc,) = ev.documents()
    assert doc[0] == 1 and doc[1] != 1 and len(doc) == 301
    for i, (prompt, answer) in enumerate(ev.passkey_prompts(200)):
        assert prompt[0] == 1 and prompt[1] != 1 and len(prompt) + len(answer) <= 200
        key = random.Random(f"1:long-eval:200:{i}").randint(1, 50000)
        assert answer == [2 + hash(str(key)) % 900]  # teacher-forced: the key's token(s)
        assert len(prompt) + len(answer) > 180  # filled by garbage up to the length


def test_tp_argmax_equals_full_argmax_and_padding_is_masked():
    """What the TP ranks' shards give: the full-vocabulary argmax (ties to the lowest id),
    padded ids never chosen."""
    import torch

    from megatron_endprompt.training.long_eval import mask_padding, pick_global_argmax

    g = torch.Generator().manual_seed(0)
    full = torch.randint(0, 4, (2, 7, 12), generator=g).float()  # many ties
    full[..., 10:] = 100.0  # padding (vocab 10 of 12) would win if not masked
    tp, v = 3, 4
    bests, idxs = [], []
    for r in range(tp):
        shard = mask_padding(full[..., r * v:(r + 1) * v], r * v, 10)
        b, i = shard.max(dim=-1)
        bests.append(b)
        idxs.append(i + r * v)
    got = pick_global_argmax(torch.stack(bests), torch.stack(idxs))
    assert torch.equal(got, full[..., :10].argmax(dim=-1))
