"""``pretrain`` command line: ``--help`` prints despite megatron-core's bare ``%`` in a help
string; a missing or malformed flag value is one ``error:`` line, not the ~700-line usage."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from megatron_endprompt.training.args import add_endprompt_args
from megatron_endprompt.training.cli_args import cli_args_provider, escape_help_strings


def _megatron_parser() -> argparse.ArgumentParser:
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    return cli_args_provider(add_endprompt_args)(parser)


def test_escape_keeps_format_specifiers():
    parser = argparse.ArgumentParser()
    parser.add_argument("--a", default=3, help="bare 100% here")
    parser.add_argument("--b", default=4, help="default %(default)s")
    assert escape_help_strings(parser) == 1
    text = parser.format_help()
    assert "bare 100% here" in text and "default 4" in text


def test_megatron_help_formats():
    text = _megatron_parser().format_help()
    assert "--endprompt-target-length" in text and "--num-layers" in text


@pytest.mark.parametrize("argv, message", [
    (["--num-layers"], "argument --num-layers: expected one argument"),
    (["--num-layers", "x"], "argument --num-layers: invalid int value: 'x'"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_bad_flag_is_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        _megatron_parser().parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"pretrain: error: {message} (see --help)"]


@pytest.mark.process
def test_entry_point_help_and_error():
    """Through ``python -m megatron_endprompt.training.pretrain`` as users run it."""
    cmd = [sys.executable, "-m", "megatron_endprompt.training.pretrain"]
    env = {**os.environ, "RANK": "0"}
    ok = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=300, env=env)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "--endprompt-target-length" in ok.stdout
    bad = subprocess.run([*cmd, "--seq-length"], capture_output=True, text=True, timeout=300,
                         env=env)
    assert bad.returncode == 2
    assert "usage:" not in bad.stderr and "Traceback" not in bad.stderr
    errors = [line for line in bad.stderr.splitlines() if "error" in line]
    assert errors == ["pretrain: error: argument --seq-length: expected one argument "
                      "(see --help)"]
