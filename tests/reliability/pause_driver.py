"""``python pause_driver.py GATE MODULE ATTR -- ARGV...``: run ``convert``'s ``main`` through
``run_cli`` in a fresh process that, at the first call of ``MODULE.ATTR``, creates
``GATE.paused`` and waits until ``GATE.go`` exists: a run caught in the middle of its work
while another one starts (the two-runs-one-output cases)."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
import time


def main() -> None:
    gate, module, attr = sys.argv[1:4]
    argv = sys.argv[sys.argv.index("--") + 1:]
    mod = importlib.import_module(module)
    original, calls = getattr(mod, attr), {"n": 0}

    def pause(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            open(gate + ".paused", "w").close()
            deadline = time.monotonic() + 600
            while not os.path.exists(gate + ".go") and time.monotonic() < deadline:
                time.sleep(0.05)
        return original(*a, **k)

    setattr(mod, attr, pause)
    from megatron_endprompt.cli import convert
    from megatron_endprompt.errors import run_cli

    with contextlib.redirect_stdout(io.StringIO()):
        rc = run_cli(convert.main, argv)
    sys.exit(rc)


if __name__ == "__main__":
    main()
