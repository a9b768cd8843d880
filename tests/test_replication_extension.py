"""The extension protocol's pieces that decide its numbers: prompts that fill their stated
length, natural fine-tuning text with no template, the training arrays, and ``retention``
with its paired differences (PI only pairs with every seed; Holm over each table)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.replication import extension_eval
from benchmarks.replication import extension_report
from benchmarks.replication import extension_text
from benchmarks.replication import extension_train
from megatron_endprompt.evaluation.passkey import passkey as PK
from megatron_endprompt.evaluation.core.prompt import TextTokens


@pytest.fixture(scope="module")
def hf_tok(tmp_path_factory):
    """A real Llama-2-shaped HF tokenizer (transformers' LlamaTokenizer over SentencePiece)."""
    from transformers import AutoTokenizer

    from benchmarks.replication import data
    from megatron_endprompt.data.prepare import synthetic

    work = tmp_path_factory.mktemp("tok")
    corpus = data.write_docs(str(work / "c.jsonl"), num_docs=120, min_tokens=60,
                             max_tokens=300, seed=1, count=lambda t: len(t) // 3,
                             fact_span=None)
    out = synthetic.build_llama2_like_tokenizer(corpus, str(work / "hf"), vocab_size=400)
    return AutoTokenizer.from_pretrained(out, local_files_only=True)


def test_every_prompt_fills_its_length_within_two_percent(hf_tok):
    plan = extension_eval.EvalPlan(lengths=(256, 512), samples=5)
    samples = extension_eval.build_samples(TextTokens(hf_tok), plan)
    assert len(samples) == 2 * 2 * 5
    for s in samples:
        used = len(s.input_ids) + s.max_new_tokens
        assert 0.98 * s.length <= used <= s.length, (s.task, s.length, used)
        assert s.answers[0] in s.prompt  # the needle / key is in the prompt
    niah = [s for s in samples if s.task == "niah_single_1"]
    assert all(s.max_new_tokens == extension_eval.NIAH_BUDGET for s in niah)
    assert {s.depth for s in samples if s.task == "passkey"} == set(
        extension_eval.PASSKEY_DEPTHS)
    # the evaluator's own builder leaves RULER's 128 tokens: "NIAH at 512" was ~380 tokens
    assert max(len(s.input_ids) for s in niah if s.length == 512) > 490


def test_fine_tuning_text_holds_no_template_and_the_base_no_evaluator_wording(tmp_path):
    corpus = tmp_path / "shakespeare.txt"
    corpus.write_text("\n\n".join(f"SPEAKER{i}:\nLine {i} of verse, and more words here."
                                  for i in range(200)), encoding="utf-8")
    count = lambda t: len(t.split())  # noqa: E731 - any monotone counter will do
    ft = tmp_path / "ft.jsonl"
    kinds = extension_text.write_natural_docs(str(ft), corpus=str(corpus), num_docs=40,
                                              min_tokens=20, max_tokens=60, seed=0,
                                              count=count)
    assert set(kinds) == {"shakespeare", "prose"} and sum(kinds.values()) == 40
    texts = [json.loads(line)["text"] for line in ft.read_text().splitlines()]
    for t in texts:
        assert "pass key" not in t and "special magic" not in t and "?" not in t
        assert count(t) <= 60
    # the fine-tuning reads the corpus' last 40%, the base its first 60%
    base_sp, ft_sp = extension_text.split_speeches(str(corpus))
    assert not set(base_sp) & set(ft_sp)
    base = tmp_path / "base.jsonl"
    extension_text.write_base_docs(str(base), corpus=str(corpus), num_docs=60,
                                   min_tokens=30, max_tokens=120, seed=0, count=count)
    for line in base.read_text().splitlines():
        t = json.loads(line)["text"]
        assert PK.FINAL_QUESTION not in t and "special magic" not in t  # held out


def test_packed_windows_and_the_schedule(tmp_path):
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    prefix = str(tmp_path / "s")
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(1000))
    b.add_document(np.arange(1, 42, dtype=np.int64), [41])
    b.finalize(prefix + ".idx")
    batch = next(extension_train.packed_batches(prefix, length=8, per_step=3, seed=0))
    assert batch["tokens"].shape == (3, 8)
    assert np.array_equal(batch["labels"], batch["tokens"] + 1)  # next token, stride 8
    assert np.all(batch["tokens"][:, 0] % 8 == 1) and np.all(batch["position_ids"][0] ==
                                                              np.arange(8))
    lrs = [extension_train.lr_at(s, lr=1.0, warmup=4, steps=20) for s in range(20)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0] and lrs[-1] > 0.1 and lrs[-1] < lrs[5]


def _results(acc):
    """rows: {row: {seed: (acc at 256, acc at 512)}} -> a results dict."""
    def entry(a0, a1):
        return {"counts": {t: {"256": [a0 * 100, 100], "512": [a1 * 100, 100]}
                           for t in ("niah_single_1", "passkey")}}
    return {"config": {"L0": 256, "L": 512}, "base": {"eval": entry(0.9, 0.0)},
            "rows": {r: {"label": r, "seeds": {s: entry(*v) for s, v in by.items()}}
                     for r, by in acc.items()}}


def test_retention_and_its_paired_differences():
    res = _results({"pi": {"-": (0.5, 0.0)},
                    "x": {"0": (0.8, 0.4), "1": (0.7, 0.4), "2": (0.9, 0.4)},
                    "y": {"0": (0.8, 0.2), "1": (0.7, 0.3), "2": (0.9, 0.1)}})
    extension_report.summarize(res, (("x", "pi"), ("x", "y")))
    r = res["summary"]["x"]["passkey"]["retention"]
    assert r["per_seed"] == pytest.approx([-0.4, -0.3, -0.5])
    # PI only (one run) pairs with every seed: retention -0.5 each
    d = res["paired"]["retention"]["x-pi"]["passkey"]
    assert d["per_seed"] == pytest.approx([0.1, 0.2, 0.0])
    xy = res["paired"]["retention"]["x-y"]["passkey"]
    assert xy["per_seed"] == pytest.approx([0.2, 0.1, 0.3])
    fam = [v for by in res["paired"]["retention"].values() for v in by.values()]
    assert len(fam) == 4 and all("p_holm" in v for v in fam)
    assert res["paired"]["L0"]["x-y"]["passkey"]["mean"] == pytest.approx(0.0)
    table = extension_report.main_table(res)
    assert "| base, s=1 (no PI) | - | 90.0 | 0.0 | -90.0 |" in table
