"""The exported model's tokenizer, in HF form.

``--tokenizer`` may be an HF tokenizer directory (loaded with ``AutoTokenizer`` and saved again),
an HF ``tokenizer.json``, or a SentencePiece ``.model`` (what Megatron's
``GPTSentencePieceTokenizer`` / ``Llama2Tokenizer`` read). transformers 5 no longer builds a fast
tokenizer from a ``.model`` file without ``protobuf``, so :func:`sentencepiece_to_hf` builds the
``tokenizers`` pipeline itself: pieces, scores and piece types from the ``sentencepiece`` API,
the model type and normaliser settings from the model's protobuf (read with a 30-line wire-format
reader), BPE merges derived from the vocabulary (a merge ``(l, r)`` exists when ``l``, ``r`` and
``l + r`` are pieces; ranked by the merged piece's id, which is SentencePiece's BPE merge order).
Token ids agree with SentencePiece's ``encode`` (tested on the demo corpus).

The written ``tokenizer_config.json`` is portable (:func:`portable_tokenizer_config`): transformers
5 saves ``tokenizer_class: "TokenizersBackend"``, which 4.x cannot import, plus how the source was
loaded (``is_local``, ``local_files_only``); the export names ``PreTrainedTokenizerFast`` (read
from ``tokenizer.json`` by transformers 4.x and 5.x alike), drops loader keys and sets
``model_max_length`` to the extended window ``L``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from megatron_endprompt.data.tokenize.gpt2_files import gpt2_files_only, gpt2_files_to_hf
from megatron_endprompt.errors import UserError

__all__ = ["LOADER_KEYS", "export_tokenizer", "portable_tokenizer_config", "sentencepiece_to_hf"]

#: ``tokenizer_config.json`` keys that record how a tokenizer was *loaded* (or transformers-5
#: internals), not what it is; a loader given them back misbehaves (``local_files_only`` on a hub
#: upload), so they are not exported.
LOADER_KEYS = ("is_local", "local_files_only", "_commit_hash", "name_or_path", "_from_auto",
               "cache_dir", "revision", "token", "use_auth_token", "trust_remote_code",
               "force_download", "subfolder", "backend")


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> dict[int, list[Any]]:
    """Protobuf wire format -> ``{field number: [values]}`` (varints as int, length-delimited
    as bytes, fixed32/64 as raw bytes)."""
    out: dict[int, list[Any]] = {}
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def _spm_settings(proto: bytes) -> dict[str, Any]:
    """Model type and normaliser settings of a serialized ``ModelProto``."""
    model = _fields(proto)
    trainer = _fields(model.get(2, [b""])[0])
    norm = _fields(model.get(3, [b""])[0])
    return {
        "model_type": {1: "unigram", 2: "bpe", 3: "word", 4: "char"}[trainer.get(3, [1])[0]],
        "byte_fallback": bool(trainer.get(35, [0])[0]),
        "charsmap": norm.get(2, [b""])[0],
        "add_dummy_prefix": bool(norm.get(3, [1])[0]),
        "remove_extra_whitespaces": bool(norm.get(4, [1])[0]),
    }


def sentencepiece_to_hf(model_path: str) -> Any:
    """A ``PreTrainedTokenizerFast`` equivalent to the SentencePiece model at ``model_path``."""
    import sentencepiece as spm
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE, Unigram
    from transformers import PreTrainedTokenizerFast

    try:
        sp = spm.SentencePieceProcessor(model_file=model_path)
    except Exception as exc:  # noqa: BLE001 - not a SentencePiece model
        raise UserError(f"--tokenizer {model_path}: not a SentencePiece model ({exc})") from None
    settings = _spm_settings(sp.serialized_model_proto())
    n = sp.get_piece_size()
    pieces = [sp.id_to_piece(i) for i in range(n)]
    unk = sp.unk_id()
    if settings["model_type"] == "bpe":
        vocab = {p: i for i, p in enumerate(pieces)}
        mergeable = {p for i, p in enumerate(pieces)
                     if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i))}
        merges = []
        for i, piece in enumerate(pieces):
            if piece not in mergeable or len(piece) < 2:
                continue
            local = [(piece[:k], piece[k:]) for k in range(1, len(piece))
                     if piece[:k] in mergeable and piece[k:] in mergeable]
            merges += sorted(local, key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
        model = BPE(vocab=vocab, merges=merges, unk_token=pieces[unk] if unk >= 0 else None,
                    fuse_unk=True, byte_fallback=settings["byte_fallback"])
    elif settings["model_type"] == "unigram":
        model = Unigram([(p, sp.get_score(i)) for i, p in enumerate(pieces)],
                        unk_id=unk if unk >= 0 else None, byte_fallback=settings["byte_fallback"])
    else:
        raise UserError(f"--tokenizer {model_path}: SentencePiece model type "
                        f"{settings['model_type']!r} is not supported (bpe, unigram are)")
    tok = Tokenizer(model)
    norm = []
    if settings["charsmap"]:
        norm.append(normalizers.Precompiled(settings["charsmap"]))
    if settings["remove_extra_whitespaces"]:
        norm += [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
    if norm:
        tok.normalizer = normalizers.Sequence(norm)
    prepend = "always" if settings["add_dummy_prefix"] else "never"
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend,
                                                 split=False)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if settings["add_dummy_prefix"]:
        steps.append(decoders.Strip(content=" ", left=1))
    tok.decoder = decoders.Sequence(steps)
    special = [pieces[i] for i in range(n) if sp.is_control(i) or sp.is_unknown(i)]
    tok.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in special])
    named = {}
    for role, idx in (("unk_token", unk), ("bos_token", sp.bos_id()),
                      ("eos_token", sp.eos_id()), ("pad_token", sp.pad_id())):
        if idx >= 0:
            named[role] = pieces[idx]
    return PreTrainedTokenizerFast(tokenizer_object=tok, **named)


def portable_tokenizer_config(config: dict[str, Any], *, model_max_length: int | None
                              ) -> dict[str, Any]:
    """``tokenizer_config.json`` that transformers 4.45-4.57 and 5.x load the same way:
    class ``PreTrainedTokenizerFast`` (the tokenizer is in ``tokenizer.json``), no
    :data:`LOADER_KEYS`, ``extra_special_tokens`` as a list stored under 4.x's
    ``additional_special_tokens`` (4.x expects a dict there), ``model_max_length`` set, and
    ``model_input_names`` pinned to ``input_ids``/``attention_mask``: without it 4.57 returns
    ``token_type_ids`` for a GPT-2-style tokenizer and ``model.generate(**tok(text))`` fails
    (a decoder-only model takes no token types)."""
    out = {k: v for k, v in config.items() if k not in LOADER_KEYS}
    out["tokenizer_class"] = "PreTrainedTokenizerFast"
    out["model_input_names"] = ["input_ids", "attention_mask"]
    extra = out.get("extra_special_tokens")
    if isinstance(extra, list):
        del out["extra_special_tokens"]
        if extra:
            out["additional_special_tokens"] = extra
    if model_max_length is not None:
        out["model_max_length"] = int(model_max_length)
    return out


def export_tokenizer(source: str, out_dir: str, *, model_max_length: int | None = None) -> Any:
    """Write the tokenizer at ``source`` into ``out_dir`` in HF form, with a portable
    ``tokenizer_config.json`` (``model_max_length``: the exported window ``L``); returns it
    (``len()`` is the number of ids, added tokens included)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if os.path.isdir(source) and gpt2_files_only(source):
        tok = gpt2_files_to_hf(os.path.join(source, "vocab.json"),
                               os.path.join(source, "merges.txt"), flag=f"--tokenizer {source}")
    elif os.path.isdir(source):
        try:
            tok = AutoTokenizer.from_pretrained(source, local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - any failure is a bad tokenizer directory
            raise UserError(f"--tokenizer {source}: not an HF tokenizer directory ({exc})") \
                from None
    elif source.endswith(".json") and os.path.isfile(source):
        tok = PreTrainedTokenizerFast(tokenizer_file=source)
    elif os.path.isfile(source):
        tok = sentencepiece_to_hf(source)
    else:
        raise UserError(f"--tokenizer {source}: no such file or directory")
    tok.save_pretrained(out_dir)
    if not os.path.isfile(os.path.join(out_dir, "tokenizer.json")):
        raise UserError(f"--tokenizer {source}: no fast tokenizer (tokenizer.json) could be "
                        "made from it; pass an HF tokenizer directory with tokenizer.json")
    path = os.path.join(out_dir, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        config = portable_tokenizer_config(json.load(f), model_max_length=model_max_length)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    if model_max_length is not None:
        tok.model_max_length = int(model_max_length)
    return tok

