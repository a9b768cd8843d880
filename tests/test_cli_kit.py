"""The command-line kit (``megatron_endprompt.cli.kit``): every console script resolves to an
entry built by ``kit.entry``, the one ValueError re-wrap, and no tool imports another tool."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys

import pytest

from megatron_endprompt.cli import kit
from megatron_endprompt.errors import UserError, user_errors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _console_scripts() -> dict[str, str]:
    tree = ast.parse(open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call)
                and getattr(n.func, "id", None) == "setup")
    points = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "entry_points"))
    return dict(line.split("=", 1) for line in points["console_scripts"])


def test_every_console_script_is_a_kit_entry_and_eval_has_one():
    scripts = _console_scripts()
    assert scripts["endprompt-eval"] == "megatron_endprompt.cli.eval:cli"
    for name, target in scripts.items():
        if name == "endprompt-pretrain":
            # one process per rank under torchrun: its main prints its one error line on rank 0
            # only and exits 2 itself (tests/training/test_cli_args.py, the start-up sweep)
            assert target == "megatron_endprompt.training.pretrain:main"
            continue
        if name == "endprompt-launch-console":
            # the launch script's pipe filter, not a tool with flags: it ignores stop signals
            # and exits 3 when a rank refused (tests/training/test_launch_console.py)
            assert target == "megatron_endprompt.cli.launch_console:main"
            continue
        module, attr = target.split(":")
        cli = getattr(importlib.import_module(module), attr)
        assert cli.__qualname__ == "entry.<locals>.cli" and cli.__module__ == module, name


def test_entry_prints_one_error_line_and_exits_2(capsys):
    def main(argv):
        with user_errors("--flag 3: "):
            raise ValueError("must be even")

    with pytest.raises(SystemExit) as exc:
        kit.entry(main)()
    assert exc.value.code == 2
    assert capsys.readouterr().err == "error: --flag 3: must be even\n"


def test_user_errors_rewraps_only_value_errors():
    with pytest.raises(UserError, match="^bad$"):
        with user_errors():
            raise ValueError("bad")
    with pytest.raises(KeyError):
        with user_errors():
            raise KeyError("not a validation error")


def test_preprocess_does_not_import_the_sidecar_tool():
    code = ("import sys, megatron_endprompt.cli.preprocess; "
            "print('megatron_endprompt.cli.build_sidecar' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT}, check=True, timeout=120)
    assert out.stdout.strip() == "False"
