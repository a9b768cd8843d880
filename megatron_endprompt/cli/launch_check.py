"""``python -m megatron_endprompt.cli.launch_check VAR=value ...``: the start-up checks of
examples/pretrain_llama3_endprompt.sh (:mod:`megatron_endprompt.training.launch_check`).
Prints the derived values as shell assignments (``PI_FACTOR=8``) for the script to ``eval``, or
one ``error: ...`` line and exits 2."""

from __future__ import annotations

import shlex
import sys

from megatron_endprompt.cli.kit import entry
from megatron_endprompt.training.launch_check import check_launch


def main(argv: list[str] | None = None) -> int:
    env = dict(a.split("=", 1) for a in (sys.argv[1:] if argv is None else argv) if "=" in a)
    for key, value in check_launch(env).items():
        print(f"{key}={shlex.quote(value)}")
    return 0


cli = entry(main)

if __name__ == "__main__":
    cli()
