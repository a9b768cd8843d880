"""Megatron's corpus naming, accepted: ``preprocess_data.py --output-prefix PREFIX`` writes
``PREFIX_text_document.bin/.idx`` (``_{json key}_document``), and Megatron users pass that name
to ``--data-path``; our preprocessing writes ``PREFIX.bin/.idx``. A prefix whose files are
missing resolves to the other spelling when exactly that one exists, and the caller says in one
line which files are used. The sidecar tool, the launch script's checks and the training
start-up all resolve through :func:`resolve_prefix`.
"""

from __future__ import annotations

import os

__all__ = ["MEGATRON_SUFFIX", "resolve_prefix"]

#: What Megatron-LM's ``preprocess_data.py`` appends for the default json key ``text``.
MEGATRON_SUFFIX = "_text_document"


def _is_corpus(prefix: str) -> bool:
    return os.path.isfile(prefix + ".bin") and os.path.isfile(prefix + ".idx")


def resolve_prefix(prefix: str) -> tuple[str, str | None]:
    """``(prefix to use, note)``: ``prefix`` itself when its ``.bin/.idx`` exist (or neither
    spelling does: the caller's not-found error names it), else ``PREFIX_text_document`` or,
    for a name ending in it, the name without it, with the one-line note to print."""
    if _is_corpus(prefix):
        return prefix, None
    if prefix.endswith(MEGATRON_SUFFIX):
        other = prefix[: -len(MEGATRON_SUFFIX)]
    else:
        other = prefix + MEGATRON_SUFFIX
    if not other or not _is_corpus(other):
        return prefix, None
    return other, (f"note: {prefix}: no {os.path.basename(prefix)}.bin/.idx; using "
                   f"{other}.bin/.idx (Megatron's preprocess_data.py names its output "
                   f"PREFIX{MEGATRON_SUFFIX}); sidecars are looked up as "
                   f"{os.path.basename(other)}[.NAME].endprompt")
