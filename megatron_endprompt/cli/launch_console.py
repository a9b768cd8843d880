"""``python -m megatron_endprompt.cli.launch_console LOG``: the console filter the launch script
pipes ``torchrun``'s output through (:mod:`megatron_endprompt.training.launch_console`): the
full output to LOG, a quiet console; exit 3 when a rank refused the launch with one
``error:`` line. It ignores the stop signals (the script and ``torchrun`` handle them) and
ends when ``torchrun`` and every rank have closed the pipe."""

from __future__ import annotations

import signal
import sys

from megatron_endprompt.training.launch_console import run_console


def main(argv: list[str] | None = None) -> int:
    """``LOG`` (empty: no log file, nothing hidden)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)  # a stop reaches torchrun; the output still flows
    sys.stdin.reconfigure(errors="replace")
    return run_console(argv[0] if argv else None)


if __name__ == "__main__":
    sys.exit(main())
