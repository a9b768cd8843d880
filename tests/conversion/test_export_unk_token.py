"""The export writes the tokenizer's ``unk_token_id`` beside BOS/EOS/PAD (a SentencePiece
Llama-2 tokenizer has ``<unk>`` = 0); before, the special-token export knew only those three
and ``config.json`` lost it."""

from __future__ import annotations

from types import SimpleNamespace

from megatron_endprompt.conversion.special_tokens import resolve_special_ids, tokenizer_ids


def test_unk_token_id_is_kept():
    tok = SimpleNamespace(bos_token_id=1, eos_token_id=2, pad_token_id=None, unk_token_id=0)
    ids, notes = resolve_special_ids(recorded={}, tokenizer=tokenizer_ids(tok), training_eod=2)
    assert ids == {"bos_token_id": 1, "eos_token_id": 2, "unk_token_id": 0}
    assert not notes
    # without a tokenizer, the source config's recorded value is kept
    ids, _ = resolve_special_ids(recorded={"eos_token_id": 2, "unk_token_id": 0},
                                 tokenizer=None, training_eod=None)
    assert ids["unk_token_id"] == 0
    # a tokenizer without one (GPT-2 style): the recorded value, never a default
    gpt2 = SimpleNamespace(bos_token_id=5, eos_token_id=5, pad_token_id=None, unk_token_id=None)
    ids, _ = resolve_special_ids(recorded={}, tokenizer=tokenizer_ids(gpt2), training_eod=5)
    assert "unk_token_id" not in ids
