"""Fixtures of the training tests."""

import pytest


@pytest.fixture(autouse=True)
def _single_thread(one_torch_thread):
    """Every training test runs on one torch thread (``one_torch_thread`` in tests/conftest.py)."""
