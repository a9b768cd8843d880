"""Perplexity puts a BOS first only when the tokenizer itself starts a text with one: a tokenizer
that names a ``bos_token`` but adds none (SmolLM2: ``<|im_start|>``, a chat-turn marker) got
that token prepended to every document as if it were a document start."""

from __future__ import annotations

from megatron_endprompt.evaluation.perplexity.windows import tokenize_documents

VOCAB = {"<|im_start|>": 0, "<|im_end|>": 1, "hello": 2, "world": 3, "[UNK]": 4}


def _tokenizer(adds_bos: bool):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if adds_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<|im_start|> $A", special_tokens=[("<|im_start|>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", unk_token="[UNK]")


def test_no_bos_for_a_tokenizer_that_adds_none():
    tok = _tokenizer(adds_bos=False)
    assert tok.bos_token_id == 0 and tok("hello world").input_ids == [2, 3]
    assert [d.tolist() for d in tokenize_documents(tok, ["hello world", "world"])] == [[2, 3],
                                                                                        [3]]


def test_bos_first_for_a_tokenizer_that_adds_it():
    tok = _tokenizer(adds_bos=True)
    assert tok("hello world").input_ids == [0, 2, 3]
    assert [d.tolist() for d in tokenize_documents(tok, ["hello world"])] == [[0, 2, 3]]
