"""BOS/EOS/PAD ids of an exported model: taken from the tokenizer saved with it.

Why one owner: ``config.json`` and ``generation_config.json`` decide where HF ``generate``,
vLLM and lm-eval stop an answer. ``LlamaConfig`` fills ``bos_token_id=1, eos_token_id=2`` by
default, so an export that kept "whatever the config holds" wrote 1/2 for every checkpoint whose
saved args had lost the source HF config -- every *trained* checkpoint: for Meta's
Llama-3 id 2 is ``#``, and each answer stopped at the first ``#``.

The rule, for trained and untrained checkpoints alike:

* the exported tokenizer defines a role (``bos``/``eos``/``pad``): its id is written, except
  that a source config's *list* of end ids that contains the tokenizer's EOS is kept whole
  (Llama-3 instruct stops on ``<|end_of_text|>`` and ``<|eot_id|>``);
* the tokenizer lacks the role: the source config's recorded value, else nothing (never
  LlamaConfig's default);
* no tokenizer is exported: the source config's values, else none -- with a note saying so;
* the tokenizer contradicts the run's own tokenizer (its EOS differs from the end-of-document id
  the checkpoint was trained with): refused, naming both.
"""

from __future__ import annotations

from typing import Any

from megatron_endprompt.errors import UserError

ROLES = ("bos", "eos", "pad", "unk")  # unk: kept in config.json (generation uses the first 3)
KEYS = tuple(f"{r}_token_id" for r in ROLES)


def tokenizer_ids(tok: Any) -> dict[str, int | None]:
    """``{"bos_token_id": ..., "eos_token_id": ..., "pad_token_id": ...}`` of an HF tokenizer."""
    return {k: getattr(tok, k, None) for k in KEYS}


def resolve_special_ids(*, recorded: dict[str, Any], tokenizer: dict[str, int | None] | None,
                        training_eod: int | None, tokenizer_flag: str = "--tokenizer"
                        ) -> tuple[dict[str, Any], list[str]]:
    """The ids to write and notes for the summary.

    ``recorded``: the source HF config's values the checkpoint carries (empty for a trained
    checkpoint). ``tokenizer``: :func:`tokenizer_ids` of the exported tokenizer, ``None`` when
    none is exported. ``training_eod``: the end-of-document id of the tokenizer the checkpoint
    was trained with, when it can be rebuilt from the saved args (``None`` otherwise).
    """
    notes: list[str] = []
    if tokenizer is None:
        ids = {k: recorded[k] for k in KEYS if recorded.get(k) is not None}
        if "eos_token_id" not in ids:
            notes.append("no tokenizer exported and no EOS recorded: config.json has no "
                         "eos_token_id (pass --tokenizer so generation stops)")
        return ids, notes
    eos = tokenizer.get("eos_token_id")
    if training_eod is not None and eos is not None and eos != training_eod:
        raise UserError(f"{tokenizer_flag}: its EOS id {eos} differs from the end-of-document id "
                        f"{training_eod} of the tokenizer the checkpoint was trained with; export "
                        "with the run's own tokenizer")
    ids: dict[str, Any] = {}
    for key in KEYS:
        mine, theirs = tokenizer.get(key), recorded.get(key)
        if mine is None:
            if theirs is not None:
                ids[key] = theirs
            continue
        if key == "eos_token_id" and isinstance(theirs, list) and mine in theirs:
            ids[key] = theirs
            continue
        if theirs is not None and theirs != mine:
            notes.append(f"{key} {theirs} of the source config replaced by the tokenizer's "
                         f"{mine}")
        ids[key] = mine
    return ids, notes
