"""``python sigterm_driver.py TOOL MODULE ATTR AT_CALL -- ARGV...``: run a tool's ``main``
through ``run_cli`` in a fresh process that sends itself ``SIGTERM`` at the ``AT_CALL``-th call
of ``MODULE.ATTR`` (a scheduler's kill while the tool writes). With a handler the tool unwinds
and exits 143; without one the process dies of the signal, temporaries left behind."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import signal
import sys

MAINS = {"preprocess": "megatron_endprompt.cli.preprocess",
         "convert": "megatron_endprompt.cli.convert", "eval": "megatron_endprompt.cli.eval"}


def main() -> None:
    tool, module, attr, at_call = sys.argv[1:5]
    argv = sys.argv[sys.argv.index("--") + 1:]
    mod = importlib.import_module(module)
    obj, name = mod, attr
    if "." in attr:
        cls, name = attr.split(".")
        obj = getattr(mod, cls)
    original, calls = getattr(obj, name), {"n": 0}

    def hit(*a, **k):
        calls["n"] += 1
        if calls["n"] == int(at_call):
            os.kill(os.getpid(), signal.SIGTERM)
        return original(*a, **k)

    setattr(obj, name, hit)
    from megatron_endprompt.errors import run_cli

    tool_main = importlib.import_module(MAINS[tool]).main
    with contextlib.redirect_stdout(io.StringIO()):
        rc = run_cli(tool_main, argv)
    sys.exit(rc)


if __name__ == "__main__":
    main()
