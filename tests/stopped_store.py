"""SQLite tracking stores whose creation was stopped in the middle of MLflow's schema migration.

:func:`start_stopped_setup` runs a store setup in a child process whose migration stops at a chosen point and says
``migrating`` on its stdout, so that the test kills it there (SIGKILL: no handler, no clean-up) without any sleep or
race. ``stop``: ``boundary`` stops after the migrations up to the middle revision committed; ``batch`` stops inside
a SQLite "batch" migration, after alembic copied a table to ``_alembic_tmp_<table>`` and before it dropped the
original. ``how``: ``old`` creates the store in place, as MLflow does on first use (what the project did before its
stores were created under a temporary name); ``new`` runs :func:`recsys_alibi.tracking.setup_tracking`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import os, sys, time
how, stop, folder = sys.argv[1:4]
os.chdir(folder)
os.environ.pop("MLFLOW_TRACKING_URI", None)
from alembic import command
from alembic.script import ScriptDirectory
import mlflow.store.db.utils as db_utils


def wait_to_be_killed():
    print("migrating", flush=True)
    time.sleep(600)
    sys.exit(3)


if stop == "boundary":
    script = ScriptDirectory.from_config(db_utils._get_alembic_config(""))
    revisions = [r.revision for r in script.walk_revisions()]
    middle = revisions[len(revisions) // 2]

    def upgrade(engine):  # MLflow's _upgrade_db, up to the middle revision
        config = db_utils._get_alembic_config(str(engine.url))
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, middle)
        wait_to_be_killed()

    db_utils._upgrade_db = upgrade
else:
    from alembic.operations.batch import ApplyBatchImpl

    copy_table = ApplyBatchImpl._create

    def stopped(self, op_impl):  # the table copied to _alembic_tmp_..., the original not dropped yet
        op_impl.drop_table = lambda *args, **kwargs: wait_to_be_killed()
        copy_table(self, op_impl)

    ApplyBatchImpl._create = stopped
if how == "old":
    from mlflow import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{os.path.abspath('mlflow.db')}").search_experiments()
else:
    from recsys_alibi.config import TrackingConfig
    from recsys_alibi.tracking import setup_tracking

    setup_tracking(TrackingConfig())
sys.exit(4)  # never stopped: the hook was not reached
"""


def kill_during_migration(folder: Path, how: str, stop: str) -> None:
    """Run a store setup in ``folder`` (``how``: ``old`` / ``new``) and SIGKILL it once its migration stopped at
    ``stop`` (``boundary`` / ``batch``)."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, how, stop, str(folder)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        said = child.stdout.readline().strip()
        if said != "migrating":
            child.wait(timeout=60)
            raise AssertionError(f"the setup never reached its stop (exit {child.returncode}): {child.stderr.read()}")
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=60)
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
