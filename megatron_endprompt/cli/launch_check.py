"""``python -m megatron_endprompt.cli.launch_check VAR=value ... [-- FLAGS...]``: the start-up
checks of examples/pretrain_llama3_endprompt.sh (:mod:`megatron_endprompt.training.launch_check`;
the extra Megatron FLAGS: :mod:`megatron_endprompt.training.launch_flags`).
Prints the derived values as shell assignments (``PI_FACTOR=8``, ``MODEL_FLAGS=(...)`` from a
converted checkpoint's record) for the script to ``eval``, or
one ``error: ...`` line and exits 2."""

from __future__ import annotations

import shlex
import sys

from megatron_endprompt import runtime
from megatron_endprompt.cli.kit import entry
from megatron_endprompt.training.launch_check import check_launch
from megatron_endprompt.training.launch_flags import check_extra_flags
from megatron_endprompt.training.launch_resume import check_warmup


def main(argv: list[str] | None = None) -> int:
    """``VAR=value ... [-- EXTRA MEGATRON FLAGS]``; a list value prints as a bash array."""
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    env = dict(a.split("=", 1) for a in argv[:cut] if "=" in a)
    extra = argv[cut + 1:]
    # Megatron's import chatter, when a resumed CHECKPOINT_OUT or the flags need it
    runtime.quiet(checkpoints=True)
    derived = check_launch(env, extra)
    check_extra_flags(extra)  # an unknown flag first: it may be the warm-up the user meant
    check_warmup(env, extra)
    for key, value in derived.items():
        if isinstance(value, list):
            print(f"{key}=({' '.join(shlex.quote(v) for v in value)})")
        else:
            print(f"{key}={shlex.quote(value)}")
    return 0


cli = entry(main)

if __name__ == "__main__":
    cli()
