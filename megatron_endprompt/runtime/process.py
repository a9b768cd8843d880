"""Process-wide state that is not torch's or Megatron's code: warning filters, logger levels and
environment variables, each changed through a :class:`~.ledger.Ledger` so
``runtime.uninstall()`` puts it back.

Why here: a filter or an environment variable set by whichever module ran first is a change
nobody owns (and no test can undo); recorded in the ledger it is listed by
``runtime.patches()`` and restored with the rest.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator

from megatron_endprompt.runtime.ledger import Ledger

__all__ = ["IMPORT_NOISE", "CHECKPOINT_NOISE", "quiet_warnings", "set_env_default"]

#: Import-time chatter that is not actionable for our users: Megatron's 'TE/Apex not installed,
#: falling back' warnings (0.18 and main warn about the local spec's fallbacks too).
IMPORT_NOISE: tuple[str, ...] = (
    ".*Transformer Engine and Apex are not installed.*",
    ".*Could not determine rank from torch.distributed.*",
    ".*absl.logging is not installed.*",
    ".*Apex is not installed.*",
    ".*Only transformer-engine>=1.7.0 supports MoE.*",
)

#: torch.distributed.checkpoint's notices about Megatron's (supported) use of its API, seen by
#: the checkpoint converter.
CHECKPOINT_NOISE: tuple[str, ...] = (
    ".*argument order of load.*",
    ".*torch.distributed is disabled.*",
    ".*Please use DTensor instead.*",
    ".*tp_group is None.*",
)


def quiet_warnings(ledger: Ledger, messages: tuple[str, ...], *,
                   loggers: tuple[str, ...] = (), patch: str = "quiet") -> None:
    """Ignore warnings matching ``messages`` and raise ``loggers`` to ERROR; on restore the
    filters added here are removed again (filters added since by others stay) and the
    loggers get their previous levels back."""
    saved_levels = {name: logging.getLogger(name).level for name in loggers}
    added: list[tuple] = []

    def undo() -> None:
        for entry in added:
            if entry in warnings.filters:
                warnings.filters.remove(entry)
        # the module's own cache reset (what filterwarnings calls); its name moved in 3.13
        getattr(warnings, "_filters_mutated", getattr(warnings, "_filters_mutated_lock_held",
                                                      lambda: None))()
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)

    ledger.on_restore(undo, patch=patch)
    for message in messages:
        before = list(warnings.filters)
        warnings.filterwarnings("ignore", message=message)
        if warnings.filters and warnings.filters[0] not in before:
            added.append(warnings.filters[0])
    for name in loggers:
        logging.getLogger(name).setLevel(logging.ERROR)


def set_env_default(ledger: Ledger, name: str, value: str, *, patch: str) -> None:
    """``os.environ.setdefault(name, value)``; a value set here is removed on restore."""
    if name in os.environ:
        return
    os.environ[name] = value
    ledger.on_restore(lambda: os.environ.pop(name, None), patch=patch)


@contextlib.contextmanager
def scoped_env(**values: str) -> Iterator[None]:
    """Set environment variables for the duration, then put back exactly what was there
    before (variables that were unset are removed again)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
