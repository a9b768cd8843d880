"""``python -m megatron_endprompt.cli.launch_check VAR=value ... [-- FLAGS...]``: the start-up
checks of examples/pretrain_llama3_endprompt.sh (:mod:`megatron_endprompt.training.launch_check`;
the extra Megatron FLAGS: :mod:`megatron_endprompt.training.launch_flags`).
Prints the derived values as shell assignments (``PI_FACTOR=8``) for the script to ``eval``, or
one ``error: ...`` line and exits 2."""

from __future__ import annotations

import shlex
import sys

from megatron_endprompt import runtime
from megatron_endprompt.cli.kit import entry
from megatron_endprompt.training.launch_check import check_launch
from megatron_endprompt.training.launch_flags import check_extra_flags


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    env = dict(a.split("=", 1) for a in argv[:cut] if "=" in a)
    derived = check_launch(env)
    runtime.quiet()  # Megatron's import chatter, when the flags need its parser
    check_extra_flags(argv[cut + 1:])
    for key, value in derived.items():
        print(f"{key}={shlex.quote(value)}")
    return 0


cli = entry(main)

if __name__ == "__main__":
    cli()
