"""The extra flags ``examples/pretrain_llama3_endprompt.sh`` appends to the Megatron command
line, checked before ``torchrun``: every option must be one the ``pretrain`` entry parses
(Megatron's or ours). A typo such as ``--dryrun`` for ``--dry-run`` would otherwise pass the
script's checks and start a real multi-rank launch, whose every rank then stops at Megatron's
parser (or, for the dry-run typo, trains for real)."""

from __future__ import annotations

import argparse
import difflib

from megatron_endprompt.errors import UserError

__all__ = ["SCRIPT_OPTIONS", "check_extra_flags"]

#: The launcher's own options (not forwarded).
SCRIPT_OPTIONS = ("--dry-run", "--help")


def _known_options() -> set[str]:
    """Option strings of the ``pretrain`` entry's parser (Megatron's + ``--endprompt-*``).
    Megatron and torch load here, only when extra flags are given (seconds)."""
    from megatron.training.arguments import add_megatron_arguments

    from megatron_endprompt.training.args import add_endprompt_args

    parser = add_endprompt_args(add_megatron_arguments(argparse.ArgumentParser(
        allow_abbrev=False)))
    return set(parser._option_string_actions)


def check_extra_flags(flags: list[str]) -> None:
    """Refuse an option among ``flags`` that the ``pretrain`` entry does not know (one
    :class:`UserError`, the closest known option suggested). Values (tokens not starting with
    ``--``) are left to Megatron's parser."""
    options = [f.split("=", 1)[0] for f in flags if f.startswith("--") and f != "--"]
    if not options:
        return
    known = _known_options()
    for option in options:
        if option in known:
            continue
        close = difflib.get_close_matches(option, [*SCRIPT_OPTIONS, *known], n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise UserError(f"unknown option {option}: neither this script's ("
                        f"{', '.join(SCRIPT_OPTIONS)}) nor a Megatron/EndPrompt flag{hint} "
                        "(nothing was launched)")
