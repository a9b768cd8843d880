"""Generated text and the tokenizers trained on it (SentencePiece; Llama-2-like SentencePiece and
Llama-3-like byte-level BPE in Hugging Face form): the embedded default data of
the quick start, the tests and the benchmarks (no download needed).

Documents are sentences from a small grammar; each document states a fact early ("The pass
key of <name> is <number>.") and repeats it at its end, so a model can only predict the end
from the beginning — a long-range dependency that EndPrompt's terminal anchoring targets.
"""

from __future__ import annotations

import json
import os

import numpy as np

from megatron_endprompt.data.prepare.prompts import BUILTIN_PROMPTS
from megatron_endprompt.disk import atomic_path

_SUBJECTS = ["the river", "a merchant", "the old king", "my sister", "the north wind",
             "a young clerk", "the garden", "our captain", "the quiet town", "a grey horse"]
_VERBS = ["remembers", "carries", "watches", "follows", "praises", "forgets", "finds",
          "answers", "builds", "crosses"]
_OBJECTS = ["the bridge", "a letter", "the harbour", "seven candles", "the long road",
            "an iron key", "the market", "a silver cup", "the winter field", "the tower"]
_TAILS = ["at dawn", "before the rain", "with great care", "in silence", "every evening",
          "without a word", "for the last time", "near the sea", "after supper", "once more"]
NAMES = ["Alder", "Brisk", "Cobalt", "Dune", "Ember", "Fennel", "Garnet", "Heron"]


def sentence(rng: np.random.Generator) -> str:
    """One grammatical sentence."""
    s = " ".join(str(rng.choice(w)) for w in (_SUBJECTS, _VERBS, _OBJECTS, _TAILS))
    return s[0].upper() + s[1:] + "."


def document(rng: np.random.Generator, n_sentences: int) -> str:
    """A document with a fact stated at the start and recalled at the end."""
    name, key = str(rng.choice(NAMES)), int(rng.integers(10000, 99999))
    body = " ".join(sentence(rng) for _ in range(n_sentences))
    return f"The pass key of {name} is {key}. {body} The pass key of {name} was {key}."


def write_corpus(path: str, *, num_docs: int, seed: int = 0,
                 min_sentences: int = 2, max_sentences: int = 120) -> str:
    """Write ``num_docs`` JSONL documents ``{"text": ...}`` of varied length to ``path``."""
    rng = np.random.default_rng(seed)
    with atomic_path(path, fsync=False) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for _ in range(num_docs):
            n = int(rng.integers(min_sentences, max_sentences + 1))
            f.write(json.dumps({"text": document(rng, n)}) + "\n")
    return path


def _training_texts(corpus_jsonl: str):
    """The built-in terminal prompts (so that they tokenize cleanly), then the corpus' texts."""
    yield from BUILTIN_PROMPTS
    with open(corpus_jsonl, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def train_sentencepiece(corpus_jsonl: str, model_prefix: str, *, vocab_size: int = 512,
                        split_digits: bool = False) -> str:
    """Train a small BPE SentencePiece model on the corpus; returns ``PREFIX.model``.

    ``split_digits``: every digit is a piece of its own, as in Llama-1/2's SentencePiece model
    (Llama-3's BPE splits numbers into groups of at most three digits). Without it, a small
    BPE learns merges such as ``"45."`` from the corpus, so the same number tokenizes one way
    where it is stated (``"12345. Remember"``) and another where it is recalled
    (``"12345 is"``), and copying it is no longer a token-for-token copy."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=_training_texts(corpus_jsonl), model_prefix=model_prefix,
        vocab_size=vocab_size,
        model_type="bpe", bos_id=-1, eos_id=1, unk_id=0, pad_id=-1, minloglevel=2,
        max_sentence_length=1 << 16, num_threads=1, character_coverage=1.0,
        byte_fallback=True, split_digits=split_digits,
    )
    return model_prefix + ".model"


# -- a Llama-2-like Hugging Face tokenizer (SentencePiece inside), built offline ---------------
#: Meta's Llama-2 ``tokenizer_config.json`` fields that decide encoding (Llama-2-7b-hf; facts of
#: the format): BOS before every text, no EOS, ``legacy: false``.
LLAMA2_TOKENIZER_CONFIG = {"add_bos_token": True, "add_eos_token": False, "legacy": False,
                           "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                           "pad_token": None, "clean_up_tokenization_spaces": False,
                           "tokenizer_class": "LlamaTokenizer"}


def build_llama2_like_tokenizer(corpus_jsonl: str, out_dir: str, *, vocab_size: int = 400
                                ) -> str:
    """Train a BPE SentencePiece model with Llama-2's trainer settings (``<unk>``/``<s>``/``</s>``
    = 0/1/2, byte fallback, digits split, identity normalisation, whitespace kept, dummy
    prefix) on the corpus and save it as a Hugging Face tokenizer directory shaped like
    Meta's Llama-2 one: ``tokenizer.model``, the ``tokenizer.json`` transformers' own
    ``LlamaTokenizer`` makes from it, and :data:`LLAMA2_TOKENIZER_CONFIG`. Returns ``out_dir``."""
    import sentencepiece as spm
    from transformers import AutoTokenizer

    os.makedirs(out_dir, exist_ok=True)
    prefix = os.path.join(out_dir, "tokenizer")
    spm.SentencePieceTrainer.train(
        sentence_iterator=_training_texts(corpus_jsonl), model_prefix=prefix,
        vocab_size=vocab_size, model_type="bpe", unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        byte_fallback=True, split_digits=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        add_dummy_prefix=True, character_coverage=1.0, max_sentence_length=1 << 16,
        num_threads=1, minloglevel=2)
    os.remove(prefix + ".vocab")
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({**LLAMA2_TOKENIZER_CONFIG, "model_max_length": 4096}, f, indent=2)
    # transformers' own SentencePiece converter writes tokenizer.json, as for Meta's repo
    AutoTokenizer.from_pretrained(out_dir).backend_tokenizer.save(
        os.path.join(out_dir, "tokenizer.json"))
    config = LLAMA2_TOKENIZER_CONFIG
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump({k: config[k] for k in ("bos_token", "eos_token", "unk_token")}, f, indent=2)
    return out_dir


# -- a Llama-3-like Hugging Face tokenizer, built offline -----------------------------------
#: Llama-3's pre-tokenizer split pattern (from Meta's ``tokenizer.json`` for Llama-3 8B; a fact
#: of the format, carried over exactly).
LLAMA3_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: Llama-3's first special tokens in Meta's order (ids 128000.. there, right after the BPE
#: vocabulary here); ``num_reserved`` more ``<|reserved_special_token_N|>`` follow.
LLAMA3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|begin_of_text|>", "<|end_of_text|>",
    "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|reserved_special_token_2|>", "<|reserved_special_token_3|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>",
)


def build_llama3_like_tokenizer(texts, out_dir: str, *, vocab_size: int = 768,
                                num_reserved: int = 6, instruct: bool = False) -> str:
    """Train a byte-level BPE on ``texts`` and save it as a Hugging Face tokenizer directory
    shaped like Meta's Llama-3 one: the same split regex and byte-level pre-tokenizer/decoder,
    the special tokens of :data:`LLAMA3_SPECIAL_TOKENS` (+ ``num_reserved`` reserved ones) after
    the ``vocab_size`` BPE ids, and a ``TemplateProcessing`` post-processor that puts
    ``<|begin_of_text|>`` before every encoded text (what Megatron's ``HuggingFaceTokenizer``
    does to each tokenized string by default). ``eos_token`` is ``<|end_of_text|>`` (a base
    model) or ``<|eot_id|>`` (``instruct=True``), as in Meta's configs.

    ``tokenizer_config.json`` is written by hand with ``PreTrainedTokenizerFast`` as the class
    (what Meta ships), so transformers 4.x and 5.x both load it. Returns ``out_dir``.
    Trains in well under a second on a few hundred KB of text.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=vocab_size, show_progress=False, min_frequency=2,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])

    def corpus():
        yield from BUILTIN_PROMPTS  # so the built-in terminal prompts tokenize compactly
        yield from texts

    tok.train_from_iterator(corpus(), trainer=trainer)
    specials = list(LLAMA3_SPECIAL_TOKENS) + [
        f"<|reserved_special_token_{i}|>" for i in range(5, 5 + num_reserved)]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    bos, eos = "<|begin_of_text|>", "<|eot_id|>" if instruct else "<|end_of_text|>"
    bos_id = tok.token_to_id(bos)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                      special_tokens=[(bos, bos_id)]),
    ])
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    decoder = {str(tok.token_to_id(s)): {"content": s, "lstrip": False, "normalized": False,
                                         "rstrip": False, "single_word": False, "special": True}
               for s in specials}
    config = {"added_tokens_decoder": decoder, "bos_token": bos, "eos_token": eos,
              "clean_up_tokenization_spaces": False,
              "model_input_names": ["input_ids", "attention_mask"],
              "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": bos, "eos_token": eos}, f, indent=2)
    return out_dir
