"""``synthetic.train_sentencepiece(split_digits=True)``: every digit is a piece of its own, so a
number tokenizes the same wherever it stands (stated, recalled, before a period), and the HF
export (:func:`~megatron_endprompt.conversion.tokenizer.sentencepiece_to_hf`) gives the same ids.

Why: without it the mini-replication's base merged a key's last digits with the period
(``"45."``), so the recall "12345." was not a token copy of "12345 is" and retrieval suffered."""

from __future__ import annotations

import json

import pytest

NUMBERS = ["The pass key is 12345. Remember it. 12345 is the pass key.",
           "One of the special magic numbers for wry-otter is: 7004561.",
           "What is the pass key? The pass key is 909.", "Call 0042, 42 or 4200!"]


@pytest.fixture(scope="module")
def models(spm_corpus, tmp_path_factory):
    from megatron_endprompt.data.prepare.synthetic import train_sentencepiece

    root = tmp_path_factory.mktemp("split_digits")
    corpus = root / "numbers.jsonl"
    with open(corpus, "w", encoding="utf-8") as f:  # numbers frequent enough to be merged
        for text in spm_corpus.texts + NUMBERS * 40:
            f.write(json.dumps({"text": text}) + "\n")
    return {split: train_sentencepiece(str(corpus), str(root / f"spm_{split}"), vocab_size=400,
                                       split_digits=split) for split in (False, True)}


def _digit_runs(sp, text: str) -> list[str]:
    """The pieces of ``text`` that contain a digit."""
    return [p for p in (sp.id_to_piece(i) for i in sp.encode(text))
            if any(c.isdigit() for c in p)]


def test_split_digits_gives_one_piece_per_digit(models):
    import sentencepiece as spm

    merged = spm.SentencePieceProcessor(model_file=models[False])
    split = spm.SentencePieceProcessor(model_file=models[True])
    # the default merges digits (and the period after them): the failure this option fixes
    assert any(len(p.strip("\u2581")) > 1 for t in NUMBERS for p in _digit_runs(merged, t))
    for text in NUMBERS:
        pieces = _digit_runs(split, text)
        assert pieces and all(len(p) == 1 for p in pieces), pieces
        assert len(pieces) == sum(c.isdigit() for c in text)
    stated, recalled = (split.encode(s) for s in ("is 12345. Remember", "is 12345 is"))
    assert stated[1:6] == recalled[1:6]  # the same ids for the key in both places


def test_split_digits_survives_the_hf_export(models, spm_corpus):
    import sentencepiece as spm

    from megatron_endprompt.conversion.tokenizer import sentencepiece_to_hf

    sp = spm.SentencePieceProcessor(model_file=models[True])
    hf = sentencepiece_to_hf(models[True])
    for text in NUMBERS + spm_corpus.texts[:10]:
        assert hf.encode(text, add_special_tokens=False) == sp.encode(text)
