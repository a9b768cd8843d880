"""GPT-2's ``vocab.json`` + ``merges.txt`` as a Hugging Face fast tokenizer.

Megatron-LM's ``GPT2BPETokenizer`` reads these two files; transformers 5 cannot load a
directory holding only them (its ``GPT2TokenizerFast`` ignores ``vocab_file``/``merges_file``
and gives an empty vocabulary). :func:`gpt2_files_to_hf` builds the same tokenizer with
``tokenizers`` (byte-level BPE, no prefix space, ``<|endoftext|>`` as BOS/EOS/UNK when the
vocabulary has it, as GPT-2's own configuration does); the export
(:mod:`megatron_endprompt.conversion.tokenizer`) and preprocessing (:func:`wrap_gpt2_files`:
a saved HF directory that Megatron's ``HuggingFaceTokenizer`` loads) both use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from megatron_endprompt.errors import UserError


def gpt2_files_only(directory: str) -> bool:
    """A GPT-2-style tokenizer directory: ``vocab.json`` + ``merges.txt`` and nothing that
    tells ``AutoTokenizer`` its class (no ``tokenizer.json``/``tokenizer_config.json``)."""
    names = set(os.listdir(directory))
    return {"vocab.json", "merges.txt"} <= names and not \
        names & {"tokenizer.json", "tokenizer_config.json", "config.json"}


def gpt2_files_to_hf(vocab_path: str, merges_path: str, *, flag: str) -> Any:
    """A ``PreTrainedTokenizerFast`` of GPT-2's ``vocab.json``/``merges.txt``; ``flag`` names
    the option in the error line of a malformed pair."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    try:
        with open(vocab_path, encoding="utf-8") as f:
            vocab = json.load(f)
        if not isinstance(vocab, dict) or not vocab:
            raise ValueError("vocab.json holds no token -> id table")
        tok = Tokenizer(BPE.from_file(vocab_path, merges_path))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        end = "<|endoftext|>" if "<|endoftext|>" in vocab else None
        if end:
            tok.add_special_tokens([AddedToken(end, special=True, normalized=False)])
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=end, eos_token=end,
                                       unk_token=end)
    except Exception as exc:  # noqa: BLE001 - a malformed vocab/merges pair
        raise UserError(f"{flag}: vocab.json/merges.txt do not make a GPT-2 tokenizer "
                        f"({str(exc)[:120]}); pass GPT-2's vocab.json and merges.txt") from None


def _wrap_dir(vocab_path: str, merges_path: str, out_root: str, *, flag: str) -> str:
    """``out_root/gpt2-hf-<12 hex>``: the pair's directory, named by the files' SHA-256."""
    digest = hashlib.sha256()
    for path in (vocab_path, merges_path):
        try:
            with open(path, "rb") as f:
                digest.update(hashlib.file_digest(f, "sha256").digest())
        except OSError as exc:
            raise UserError(f"{flag} {path}: cannot read ({exc.strerror}); pass GPT-2's "
                            "vocab.json and merges.txt") from None
    return os.path.join(out_root, f"gpt2-hf-{digest.hexdigest()[:12]}")


def wrap_gpt2_files(vocab_path: str, merges_path: str, out_root: str, *, flag: str) -> str:
    """The HF directory (``tokenizer.json`` + config) of the pair under ``out_root``, named by
    the files' SHA-256 (``gpt2-hf-<12 hex>``) and written once, atomically (a rename); an
    existing one is reused. Returns its path."""
    target = _wrap_dir(vocab_path, merges_path, out_root, flag=flag)
    if os.path.isfile(os.path.join(target, "tokenizer.json")):
        return target
    tok = gpt2_files_to_hf(vocab_path, merges_path, flag=flag)
    os.makedirs(out_root, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=out_root, prefix=".gpt2-hf-")
    try:
        tok.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another run wrote it first: theirs is the same tokenizer
            if not os.path.isfile(os.path.join(target, "tokenizer.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def wrapped_gpt2_files(vocab_path: str, merges_path: str, out_root: str, *,
                       flag: str) -> Iterator[str]:
    """:func:`wrap_gpt2_files` for the duration of one run: yields the directory, and removes
    it again (with the directories made to hold it) when the run fails and this call made it,
    so a refused run leaves nothing beside its output. One reused from an earlier run stays."""
    made = []
    probe = os.path.abspath(out_root)
    while not os.path.exists(probe):
        made.append(probe)
        probe = os.path.dirname(probe)
    existed = os.path.isfile(os.path.join(_wrap_dir(vocab_path, merges_path, out_root,
                                                    flag=flag), "tokenizer.json"))
    target = wrap_gpt2_files(vocab_path, merges_path, out_root, flag=flag)
    try:
        yield target
    except BaseException:
        if not existed:
            shutil.rmtree(target, ignore_errors=True)
            for directory in made:  # deepest first; only if the run left them empty
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
        raise
