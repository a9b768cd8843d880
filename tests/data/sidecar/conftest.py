"""Fixtures of the sidecar tests."""

from __future__ import annotations

import pytest
from test_sidecar import _write_set


@pytest.fixture
def good(tmp_path) -> str:
    """The prefix of a valid small corpus with its sidecar, fresh for each test."""
    prefix = str(tmp_path / "d")
    _write_set(prefix)
    return prefix
