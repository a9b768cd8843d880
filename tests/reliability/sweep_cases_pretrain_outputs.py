"""The sweep's pretrain start-up table, round 3: outputs and features that passed start-up and
failed only later on every rank — ``--save`` on a read-only mount or naming a file (each rank's
``OSError`` at the first save), ``--context-parallel-size 2`` without Transformer Engine
attention (Megatron's assertion after the model is built), a missing tokenizer (a traceback on
every rank)."""

from __future__ import annotations

import os

from sweep import Case
from sweep_pretrain import base


def _file(d: str, name: str) -> str:
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write("not a directory\n")
    return path


def _tokenizer(kind: str, missing: str):
    return lambda fx, d: base(fx, d, "--tokenizer-type", kind, "--tokenizer-model",
                              os.path.join(d, missing))


CASES = [
    Case("pt_save_read_only_mount", "pretrain",
         lambda fx, d: base(fx, d, "--save", "/proc/endprompt-save", "--save-interval", "1"),
         item="36", needle="--save /proc/endprompt-save"),
    Case("pt_save_names_a_file", "pretrain",
         lambda fx, d: base(fx, d, "--save", _file(d, "out.txt"), "--save-interval", "1"),
         item="36", needle="--save"),
    Case("pt_sentencepiece_tokenizer_missing", "pretrain",
         _tokenizer("GPTSentencePieceTokenizer", "nope.model"), item="36",
         needle="--tokenizer-model"),
    Case("pt_hf_tokenizer_dir_missing", "pretrain",
         _tokenizer("HuggingFaceTokenizer", "no_tokenizer_dir"), item="36",
         needle="--tokenizer-model"),
]
