"""Fixtures of the data tests."""

from __future__ import annotations

import pytest

from megatron_endprompt.cli import preprocess as preprocess_cli


@pytest.fixture(scope="module")
def good_output(spm_args, tmp_path_factory):
    """A good output prefix, built once; tests copy it (``_copy_good``) before damaging it."""
    from megatron_endprompt.errors import run_cli

    prefix = str(tmp_path_factory.mktemp("good") / "good")
    assert run_cli(preprocess_cli.main, spm_args(prefix)) == 0
    return prefix
