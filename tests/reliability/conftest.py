"""Fixtures of the reliability tests: the sweep's shared inputs, built once per session."""

from __future__ import annotations

import pytest
import sweep_fixtures


@pytest.fixture(scope="session")
def fx(tmp_path_factory):
    """See :func:`sweep_fixtures.build` (SPM + NullTokenizer prefixes, tiny HF Llama and its
    NaN copy, Megatron conversions, an HF export)."""
    return sweep_fixtures.build(str(tmp_path_factory.mktemp("sweep_fixtures")))
