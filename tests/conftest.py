"""Shared fixtures: the real data folder beside the checkout, an isolated MLflow store."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    """``../shared/data`` (public behaviour logs, never copied into the repo); skip where absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA} (the ../shared/data folder beside the checkout)")
    return SHARED_DATA


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch) -> str:
    """A fresh embedded MLflow store (SQLite + local artifacts) in a temporary working directory."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture
def one_torch_thread():
    """Tiny tensors: one thread is much faster than two on a shared 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
