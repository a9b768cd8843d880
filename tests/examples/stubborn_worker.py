"""A torchrun worker that never stops on request, for the launch script's STOP_GRACE timer
(tests/examples/test_stop_grace.py; the subject is the script's timer, not training). With
``STUBBORN=caught`` it installs a handler for ``--exit-signal`` that only records the signal
(a rank that never reaches Megatron's iteration boundary, e.g. hung in a collective: the script
sees a handler and sends the signal once); with ``STUBBORN=starting`` it keeps the inherited
"ignore" (a rank hung in start-up: the script waits for a handler that never comes). SIGINT is
ignored too, so torchrun's own shutdown must kill it after ``SHUTDOWN_TIMEOUT``."""

import os
import signal
import sys
import time


def main() -> None:
    sig = signal.Signals[sys.argv[sys.argv.index("--exit-signal") + 1]]
    out = os.environ["STOP_DIR"]
    rank = os.environ["RANK"]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.environ["STUBBORN"] == "caught":
        def note(signum, frame):
            with open(os.path.join(out, f"got.{rank}"), "a") as f:
                f.write(f"{time.monotonic()}\n")

        signal.signal(sig, note)
    with open(os.path.join(out, f"ready.{rank}"), "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(0.05)


if __name__ == "__main__":
    main()
