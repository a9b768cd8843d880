"""``python -m megatron_endprompt.cli.launch_check VAR=value ...``: the start-up checks of
examples/pretrain_llama3_endprompt.sh (:mod:`megatron_endprompt.training.launch_check`).
Prints the derived values as shell assignments (``PI_FACTOR=8``, ``MODEL_FLAGS=(...)`` from a
converted checkpoint's record) for the script to ``eval``, or
one ``error: ...`` line and exits 2."""

from __future__ import annotations

import shlex
import sys

from megatron_endprompt.cli.kit import entry
from megatron_endprompt.training.launch_check import check_launch


def main(argv: list[str] | None = None) -> int:
    """``VAR=value ... [-- EXTRA MEGATRON FLAGS]``; a list value prints as a bash array."""
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    env = dict(a.split("=", 1) for a in argv[:cut] if "=" in a)
    for key, value in check_launch(env, argv[cut + 1:]).items():
        if isinstance(value, list):
            print(f"{key}=({' '.join(shlex.quote(v) for v in value)})")
        else:
            print(f"{key}={shlex.quote(value)}")
    return 0


cli = entry(main)

if __name__ == "__main__":
    cli()
