"""Fixtures of the scoring tests (helpers live in ``serving_fixtures``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from serving_fixtures import write_prepared


@pytest.fixture
def prepared(tmp_path) -> Path:
    """A prepared dir of 23 users (histories of 1..40 events) over 30 items."""
    return write_prepared(tmp_path / "prepared")


@pytest.fixture(autouse=True)
def _single_thread(one_torch_thread):
    """Every scoring test runs on one torch thread (``one_torch_thread`` in tests/conftest.py)."""
