"""A new SQLite tracking store appears complete or not at all (:func:`recsys_alibi.tracking.setup_tracking`); one
left half-made (by the in-place creation of an older version, or another tool) is one ``error:`` line, exit 2, and
is never replaced when it may hold runs (break-daily-s67 finding 1)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from pipelines.cli import main
from recsys_alibi.config import TrackingConfig
from recsys_alibi.tracking import setup_tracking
from recsys_alibi.tracking_store import StoreError, ready_store
from stopped_store import kill_during_migration


@pytest.fixture(autouse=True)
def own_store(tmp_path, monkeypatch):
    """The default store of the working directory (``tmp_path``), as a first run in a new folder sees it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield
    mlflow.set_tracking_uri(None)


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _logs_a_run(experiment_id: str) -> None:
    with mlflow.start_run(experiment_id=experiment_id) as run:
        mlflow.log_metric("m", 1.0)
    assert MlflowClient().get_run(run.info.run_id).data.metrics == {"m": 1.0}


@pytest.mark.parametrize("stop", ["boundary", "batch"])
def test_a_setup_killed_during_migration_leaves_no_store_and_the_next_setup_logs_runs(tmp_path, stop):
    kill_during_migration(tmp_path, "new", stop)  # SIGKILL: nothing of the process cleans up
    assert not (tmp_path / "mlflow.db").exists()
    assert (tmp_path / "mlflow.db.setup.tmp").exists()  # the half-made store lies under the temporary name
    _logs_a_run(setup_tracking(TrackingConfig()))
    assert _names(tmp_path) == ["mlflow.db", "mlflow.db.setup.lock"]  # the temporary removed


def test_a_setup_stopped_in_the_process_removes_its_temporary(tmp_path, monkeypatch):
    from mlflow.store.db import utils as db_utils

    def stopped(engine):  # a SIGTERM raises in the CLI (a BaseException, as Ctrl-C)
        raise KeyboardInterrupt

    monkeypatch.setattr(db_utils, "_upgrade_db", stopped)
    with pytest.raises(KeyboardInterrupt):
        setup_tracking(TrackingConfig())
    assert _names(tmp_path) == ["mlflow.db.setup.lock"]


@pytest.mark.parametrize("stop", ["boundary", "batch"])
def test_a_half_made_store_is_one_error_line_exit_2_and_kept(tmp_path, capsys, stop):
    kill_during_migration(tmp_path, "old", stop)  # created in place, as before: the store is half-made
    store = tmp_path / "mlflow.db"
    before = store.read_bytes()
    assert main(["pipeline", "--output", "out"]) == 2  # refused by the preflight, before any data work
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert err[0].startswith(f"error: the MLflow store {store} is half-made: its creation was stopped during "
                             "MLflow's schema migration (its schema is at revision ")  # fmt: skip
    if stop == "batch":
        assert "the stopped migration left the table _alembic_tmp_" in err[0]
    assert err[0].endswith("); it holds no runs, experiments or models: delete it and run again (a new store is "
                           "then created complete)")  # fmt: skip
    assert store.read_bytes() == before and _names(tmp_path) == ["mlflow.db", "mlflow.db.setup.lock"]
    with pytest.raises(StoreError, match="is half-made"):  # train, evaluate, score, export, the benchmarks
        setup_tracking(TrackingConfig())
    store.unlink()  # as the line says
    _logs_a_run(setup_tracking(TrackingConfig()))


def _damage(store: Path, revision: str, leftover: bool) -> None:
    with contextlib.closing(sqlite3.connect(store)) as con, con:
        con.execute("UPDATE alembic_version SET version_num = ?", [revision])
        if leftover:
            con.execute("CREATE TABLE _alembic_tmp_runs AS SELECT * FROM runs")


@pytest.mark.parametrize("leftover", [True, False])
def test_a_store_with_runs_is_never_replaced(tmp_path, new_store, leftover):
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    store = tmp_path / "mlflow.db"
    uri = new_store(store)
    mlflow.set_tracking_uri(uri)
    _logs_a_run("0")
    older = ScriptDirectory.from_config(_get_alembic_config("")).get_revision("head").down_revision
    _damage(store, older, leftover)
    before = store.read_bytes()
    if leftover:  # a migration of a store with runs that was stopped: refused, left as it is
        with pytest.raises(StoreError) as refused:
            ready_store(uri)
        assert str(refused.value) == (
            f"the MLflow store {store} is half-migrated (its schema is at revision {older}, not "
            f"{ScriptDirectory.from_config(_get_alembic_config('')).get_current_head()}, and the stopped migration "
            "left the table _alembic_tmp_runs) and may hold runs (experiments 1, runs 1, registered models 0), so "
            "it was left as it is: restore it from a backup, or repair it (drop the leftover tables, then "
            f"`mlflow db upgrade sqlite:///{store}`), or point tracking.uri / MLFLOW_TRACKING_URI at another store")
    else:  # an older MLflow's complete store: MLflow migrates it itself when it opens it
        ready_store(uri)
    assert store.read_bytes() == before


def test_an_empty_store_file_and_a_leftover_temporary_give_way_to_a_complete_store(tmp_path):
    (tmp_path / "mlflow.db").touch()  # SQLite's new file, nothing written: no store yet
    (tmp_path / "mlflow.db.setup.tmp").write_text("left by a setup that was killed")
    (tmp_path / "mlflow.db.setup.tmp-journal").write_text("and its journal")
    _logs_a_run(setup_tracking(TrackingConfig()))
    assert _names(tmp_path) == ["mlflow.db", "mlflow.db.setup.lock"]


def test_a_file_that_is_no_sqlite_database_is_one_line_and_kept(tmp_path, capsys):
    (tmp_path / "mlflow.db").write_text("kept")
    assert main(["pipeline", "--output", "out"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [f"error: the MLflow store {tmp_path / 'mlflow.db'} is no SQLite database MLflow can open (file is "
                   "not a database); move it away, or point tracking.uri / MLFLOW_TRACKING_URI at another store"]
    assert (tmp_path / "mlflow.db").read_text() == "kept"


@pytest.mark.parametrize("uri", ["http://localhost:5000", "postgresql://user@localhost/mlflow", "databricks"])
def test_other_stores_are_left_to_mlflow(tmp_path, uri):
    ready_store(uri)  # connects to nothing, creates nothing
    assert _names(tmp_path) == []
