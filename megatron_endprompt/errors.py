"""User-facing errors: one clear line naming the file or flag and the fix, no traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable


class UserError(Exception):
    """Bad input from the user. Command-line tools print ``error: <message>`` and exit 2."""


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run a tool's ``main``; turn :class:`UserError` (and config ``ValueError``s raised while
    validating flags, wrapped as UserError by the tool) into one line on stderr and exit 2."""
    try:
        return int(main(argv) or 0)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; no output was finalised", file=sys.stderr)
        return 130
