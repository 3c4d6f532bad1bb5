"""Shared fixtures: the real data folder beside the checkout, an isolated MLflow store."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

# Inductor compiles the FlexAttention tests' kernels in this process rather than in a pool of its own that it
# would start per process (faster with two cores, and two pytest-xdist workers, on the machine)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def pytest_configure(config):
    """Under pytest-xdist (``make test``: two workers on two cores) each worker computes with one torch thread:
    two workers of two threads each would contend for the cores. Tests that set their own count restore it."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.fixture
def shared_data() -> Path:
    """``../shared/data`` (public behaviour logs, never copied into the repo); skip where absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA} (the ../shared/data folder beside the checkout)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def new_store(tmp_path_factory):
    """``new_store(db) -> uri``: at ``db`` the store MLflow would create there on first use: a copy of one empty
    store whose tables MLflow created and migrated once per session (about 3 s a store on a 2-core machine; some
    70 tests need a new one), its Default experiment keeping artifacts under ``db``'s folder (``mlruns/0``) as
    MLflow's would in that working directory. Tests of a store that does not exist yet do not use it."""
    from mlflow import MlflowClient

    template = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{template}").search_experiments()

    def make(db: Path) -> str:
        db.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, db)
        with contextlib.closing(sqlite3.connect(db)) as con, con:
            con.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                        [str(db.parent / "mlruns" / "0")])  # fmt: skip
        return f"sqlite:///{db}"

    return make


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch, new_store) -> str:
    """A new embedded MLflow store (SQLite + local artifacts) in a temporary working directory."""
    monkeypatch.chdir(tmp_path)
    uri = new_store(tmp_path / "mlflow.db")
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
