"""Fixtures of the training tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny tensors: one thread is much faster than two on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
