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
def one_torch_thread():
    """Tiny tensors: one thread is ~10x faster than two on a shared 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
