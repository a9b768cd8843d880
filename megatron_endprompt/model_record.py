"""The model's shape recorded beside a converted checkpoint, so the launcher builds the model the
checkpoint holds instead of asking the user to repeat it as flags.

``hf-to-megatron`` writes ``endprompt_conversion.json`` next to the checkpoint; its
``megatron_flags`` build the architecture (layers, hidden, heads, KV groups, FFN, norm epsilon,
RoPE base, tying, ...). The launcher (examples/pretrain_llama3_endprompt.sh, through
:mod:`megatron_endprompt.training.launch_check`) passes them instead of its Llama-3 8B defaults,
and refuses a given flag or variable that contradicts them: without this a tied model died at
load (``KeyError: 'output_layer.weight'``) after the dry run had passed. A base module (like
``errors``): ``conversion`` writes the record, ``training`` reads it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from megatron_endprompt.errors import UserError

__all__ = ["CONVERSION_RECORD", "ModelRecord", "read_model_record"]

#: Written next to the checkpoint by ``hf-to-megatron``: source, Megatron flags, vocabulary.
CONVERSION_RECORD = "endprompt_conversion.json"

#: Flags of the record that are the launch's choice, not the model's: the launcher sets them.
_LAUNCH_CHOICES = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                   "--max-position-embeddings")

#: Shape flags taking a value, and the boolean ones; a given one must agree with the record.
_VALUED = ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
           "--kv-channels", "--num-query-groups", "--rotary-base", "--norm-epsilon",
           "--normalization", "--position-embedding-type", "--rope-scaling-factor",
           "--make-vocab-size-divisible-by")
_SWITCHES = ("--untie-embeddings-and-output-weights", "--group-query-attention", "--swiglu",
             "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm", "--use-rope-scaling")


def _same(a: str, b: str) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    except ValueError:
        return a == b


@dataclass(frozen=True, kw_only=True)
class ModelRecord:
    """The architecture a converted checkpoint holds (from its conversion record)."""

    path: str
    """The record file (named in every refusal)."""
    flags: tuple[str, ...]
    """Megatron flags building the model, without the launch's own choices (TP, PP, window)."""
    max_position_embeddings: int
    """The source model's window (the launcher's default ``ORIGINAL_LENGTH``)."""
    vocab_size: int
    """The tokenizer's vocabulary size (unpadded)."""
    padded_vocab_size: int
    """The embedding rows in the checkpoint (padded at conversion)."""

    def value(self, flag: str) -> str | None:
        """The value of ``flag`` in the record (``None`` when absent)."""
        return self.flags[self.flags.index(flag) + 1] if flag in self.flags else None

    def int_value(self, flag: str, default: int | None = None) -> int:
        v = self.value(flag)
        return int(v) if v is not None else int(default)

    @property
    def heads(self) -> int:
        return self.int_value("--num-attention-heads")

    @property
    def query_groups(self) -> int:
        return self.int_value("--num-query-groups", self.heads)

    @property
    def layers(self) -> int:
        return self.int_value("--num-layers")

    @property
    def tied(self) -> bool:
        return "--untie-embeddings-and-output-weights" not in self.flags

    def check_padding(self, tp: int) -> None:
        """The embedding the launch at ``TP=tp`` builds has the checkpoint's rows (Megatron
        pads the vocabulary to a multiple of ``--make-vocab-size-divisible-by x TP``)."""
        multiple = self.int_value("--make-vocab-size-divisible-by", 128) * tp
        padded = -(-self.vocab_size // multiple) * multiple
        if padded != self.padded_vocab_size:
            raise UserError(f"TP={tp}: the vocabulary pads to {padded} rows but the checkpoint "
                            f"({self.path}) has {self.padded_vocab_size}; convert again with "
                            f"hf-to-megatron --tensor-parallel-size {tp}")

    def check_given(self, given: dict[str, tuple[str, str]], extra: list[str]) -> None:
        """Refuse a launcher variable (``given``: ``{VAR: (flag, value)}``) or an extra flag
        that contradicts the record; one :class:`UserError` naming both and the fix."""
        checks = [(f"{var}={value}", "unset", flag, value)
                  for var, (flag, value) in given.items()]
        i = 0
        while i < len(extra):
            flag, eq, inline = extra[i].partition("=")
            if flag in _VALUED:
                value = inline if eq else (extra[i + 1] if i + 1 < len(extra) else "")
                checks.append((f"{flag} {value}", "drop", flag, value))
                i += 1 if eq else 2
                continue
            if flag in _SWITCHES and flag not in self.flags:
                what = "tied embeddings" if flag.startswith("--untie") else f"no {flag}"
                raise UserError(f"{flag} contradicts the checkpoint ({self.path}: {what}); drop "
                                "the flag: the launcher takes the model from the checkpoint")
            i += 1
        for shown, fix, flag, value in checks:
            have = self.value(flag)
            if flag == "--num-query-groups" and have is None:
                have = str(self.heads)
            if have is None or not _same(value, have):
                raise UserError(f"{shown} contradicts the checkpoint ({self.path}: {flag} "
                                f"{have or 'not set'}); {fix} it: the launcher takes the model "
                                "from the checkpoint")


def read_model_record(checkpoint: str) -> ModelRecord | None:
    """The record beside ``checkpoint`` (a converted base), or ``None`` when there is none."""
    path = os.path.join(checkpoint, CONVERSION_RECORD)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        flags = [str(v) for v in raw["megatron_flags"]]
        window = int(flags[flags.index("--max-position-embeddings") + 1])
        vocab, padded = int(raw["vocab_size"]), int(raw["padded_vocab_size"])
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise UserError(f"{path}: unreadable conversion record ({exc}); convert the model again "
                        "with tools/convert_checkpoint.py hf-to-megatron") from None
    kept, i = [], 0
    while i < len(flags):
        if flags[i] in _LAUNCH_CHOICES:
            i += 2
            continue
        kept.append(flags[i])
        i += 1
    return ModelRecord(path=path, flags=tuple(kept), max_position_embeddings=window,
                       vocab_size=vocab, padded_vocab_size=padded)
