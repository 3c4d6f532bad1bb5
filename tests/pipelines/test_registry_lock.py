"""The promotion lock: a file lock beside a local store, a tag lease on any other store."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import mlflow
import pytest

from pipelines import registry_lock
from pipelines.registry_lock import LEASE_TAG, PromotionLockTimeout, local_store_path, lock_file, promotion_lock


def test_local_store_paths_and_lock_file_names(tmp_path):
    assert local_store_path("sqlite:////srv/mlflow/mlflow.db") == Path("/srv/mlflow/mlflow.db")
    assert local_store_path("sqlite:///mlflow.db") == Path("mlflow.db")
    assert local_store_path("http://127.0.0.1:5000") is None
    assert local_store_path("postgresql://u@db/mlflow") is None
    assert lock_file(Path("/srv/mlflow.db"), "my model/x") == Path("/srv/mlflow.db.promotion-my_model_x.lock")


def test_file_lock_excludes_a_second_holder_until_released(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    inside, release = threading.Event(), threading.Event()

    def hold():
        with promotion_lock(uri, "m"):
            inside.set()
            release.wait(timeout=60)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(timeout=60)
    with pytest.raises(PromotionLockTimeout, match="promotion lock .*mlflow.db.promotion-m.lock"):
        with promotion_lock(uri, "m", timeout_s=0.3):
            pass
    with promotion_lock(uri, "other-model", timeout_s=0.3):  # another model's alias: another lock
        pass
    release.set()
    holder.join(timeout=60)
    with promotion_lock(uri, "m", timeout_s=5) as held:
        assert held.endswith("mlflow.db.promotion-m.lock")


def test_tag_lease_waits_for_a_live_holder_and_takes_an_expired_one(mlflow_store, monkeypatch):
    monkeypatch.setattr(registry_lock, "LEASE_SETTLE_S", 0.05)
    monkeypatch.setattr(registry_lock, "POLL_S", 0.05)
    client = mlflow.MlflowClient()
    client.create_registered_model("leased")
    client.set_registered_model_tag("leased", LEASE_TAG, f"someone {time.time() + 600:.0f}")
    with pytest.raises(PromotionLockTimeout, match="promotion lease"):
        with registry_lock._tag_lease("leased", timeout_s=0.3):
            pass
    client.set_registered_model_tag("leased", LEASE_TAG, f"someone {time.time() - 1:.0f}")  # its holder died
    with registry_lock._tag_lease("leased", timeout_s=5) as held:
        token = held.removeprefix("lease ")
        assert client.get_registered_model("leased").tags[LEASE_TAG].startswith(token)
    assert LEASE_TAG not in client.get_registered_model("leased").tags


SETUP = """
import sys, time
from pathlib import Path
import mlflow  # the slow import first: every process then reaches the store at the same moment
from recsys_alibi.config import TrackingConfig
from recsys_alibi.tracking import setup_tracking
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.01)
print(setup_tracking(TrackingConfig(uri=sys.argv[1], experiment="together")))
"""


def test_jobs_started_together_on_a_new_sqlite_store_all_set_it_up(tmp_path):
    """Four ``train`` jobs of a scheduler, one new store: each gets the same experiment, none a traceback."""
    import os
    import subprocess
    import sys
    import time

    uri, go = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}", tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    procs = [subprocess.Popen([sys.executable, "-c", SETUP, uri, str(go)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]  # fmt: skip
    time.sleep(8)  # all four have imported MLflow and wait for the start
    go.touch()
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-800:] for _, err in outputs]
    assert len({out.strip() for out, _ in outputs}) == 1  # one experiment id
