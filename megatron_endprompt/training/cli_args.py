"""Command-line behaviour of the ``pretrain`` entry on top of Megatron's parser.

Megatron builds its ``argparse`` parser inside ``parse_args`` and hands it to the
``extra_args_provider``; :func:`cli_args_provider` wraps our providers so that the parser it
returns

* prints ``--help``: megatron-core 0.19.2 has a help string with a bare ``%`` (argparse
  %-formats help strings and raises ``ValueError``); such strings are escaped on *our* parser
  object, Megatron's files are untouched;
* reports a missing or malformed flag value as one line (``pretrain: error: argument
  --num-layers: expected one argument (see --help)``) instead of argparse's ~700-line usage
  followed by the error; only rank 0 prints it under ``torchrun``; exit status 2 as argparse.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = ["cli_args_provider", "escape_help_strings", "one_line_errors"]

Provider = Callable[[argparse.ArgumentParser], argparse.ArgumentParser]


def escape_help_strings(parser: argparse.ArgumentParser) -> int:
    """Escape ``%`` in every help string argparse cannot format; returns how many were fixed."""
    formatter = parser._get_formatter()
    fixed = 0
    for action in parser._actions:
        if not action.help or action.help is argparse.SUPPRESS or "%" not in action.help:
            continue
        try:
            formatter._expand_help(action)
        except (ValueError, TypeError, KeyError):
            action.help = action.help.replace("%", "%%")
            fixed += 1
    return fixed


def one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser.error`` print one ``error:`` line (rank 0 only) and exit 2."""

    def error(message: str) -> NoReturn:
        if os.environ.get("RANK", "0") == "0":
            print(f"{parser.prog}: error: {message} (see --help)", file=sys.stderr, flush=True)
        sys.exit(2)

    parser.error = error  # type: ignore[method-assign]
    return parser


def cli_args_provider(*providers: Provider) -> Provider:
    """An ``extra_args_provider`` that applies ``providers`` then the two fixes above."""

    def provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        for add in providers:
            parser = add(parser)
        parser.prog = "pretrain"
        escape_help_strings(parser)
        return one_line_errors(parser)

    return provider
