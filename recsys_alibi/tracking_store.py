"""The local SQLite tracking store: where it is, its setup lock, and its creation complete or not at all.

MLflow creates a new SQLite store in place (its tables, then its schema migrations, 1-3 s) on first use; a
process stopped in between left a half-migrated file every later MLflow call failed on. Here a new store is
created under a temporary name and renamed into place (:func:`ready_locked_store`), and a store left half-made
by anything else is refused with one line (:class:`StoreError`). Other stores (a server, PostgreSQL) are left to
MLflow.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from recsys_alibi.config import ConfigError


@contextlib.contextmanager
def store_setup_lock(uri: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``<db>.setup.lock`` beside a ``sqlite:///`` store while it is set up.

    MLflow creates (and migrates) the tables of a new SQLite store on first use; two processes
    doing that at once fail with "table ... already exists", and two creating the same experiment
    fail with "already exists". Other stores (a server) do this themselves.
    """
    store = sqlite_store_path(uri)
    if store is None:
        yield
        return
    store.parent.mkdir(parents=True, exist_ok=True)
    with store.with_name(f"{store.name}.setup.lock").open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released with the file (also when the process dies)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class StoreError(ConfigError):
    """A local SQLite tracking store MLflow cannot use as it is: half-made by a creation or schema migration that
    was stopped, or no SQLite database at all. The one line names the file and what to do (exit 2)."""


STORE_SETUP_SUFFIX = ".setup.tmp"  # beside the store: where a new store is created and migrated before its rename
# tables MLflow's own migrations write a row into: rows there say nothing about runs
_SEEDED_TABLES = frozenset({"alembic_version", "workspaces"})
_ALEMBIC_TEMP = "_alembic_tmp_"  # alembic's copy of a table during a SQLite "batch" migration


def ready_store(uri: str) -> None:
    """Make the ``sqlite:///`` store of ``uri`` ready before MLflow opens it, under its setup lock: a store that does
    not exist (or holds no table) is created complete (:func:`ready_locked_store`), a half-made one is refused. Other
    stores (a server, PostgreSQL, ...) are left to MLflow.

    Raises:
        StoreError: the store is half-made or no SQLite database (one line naming it and the fix).
    """
    store = sqlite_store_path(uri)
    if store is None:
        return
    with store_setup_lock(uri):
        ready_locked_store(store)


def ready_locked_store(store: Path) -> None:
    """:func:`ready_store` with the setup lock held.

    MLflow creates a new SQLite store in place: its tables, then its schema migrations (1-3 s), whose work is not
    undone as a whole when the process stops. A process stopped in between (SIGTERM, SIGKILL, a power cut) left a
    half-migrated file that every later MLflow call fails on ("table _alembic_tmp_datasets already exists"). Here the store is created and migrated by MLflow's own first-use code
    under a temporary name beside it, its connections closed, then renamed into place: the store's path holds a
    complete store or nothing. A temporary file left by a setup that was stopped is removed first (it never was
    the store).
    """
    temp = store.with_name(f"{store.name}{STORE_SETUP_SUFFIX}")
    _remove_sqlite_files(temp)
    state = _store_state(store)
    if state is None:
        _create_store(store, temp)
        return
    problem = state.problem()
    if problem is not None:
        raise StoreError(problem)


def _remove_sqlite_files(path: Path, *, journals_only: bool = False) -> None:
    """``path`` (unless ``journals_only``) and the journal files SQLite keeps beside it (none of them a store anyone
    uses)."""
    journals = (f"{path.name}-journal", f"{path.name}-wal", f"{path.name}-shm")
    for name in journals if journals_only else (path.name, *journals):
        with contextlib.suppress(FileNotFoundError):
            path.with_name(name).unlink()


def _create_store(store: Path, temp: Path) -> None:
    """Create and migrate a new store at ``temp`` as MLflow does on first use, then rename it to ``store``."""
    from mlflow.store.db import utils as db_utils

    engine = db_utils.create_sqlalchemy_engine(f"sqlite:///{temp}")
    try:
        db_utils._initialize_tables(engine)  # what MLflow's SqlAlchemyStore runs on a database without its tables
        db_utils._verify_schema(engine)
    except BaseException:  # a SIGTERM (KeyboardInterrupt, the CLI's own exception) too: nothing is left behind
        engine.dispose()
        _remove_sqlite_files(temp)
        raise
    engine.dispose()  # every connection closed: no journal is left beside the temporary file
    with open(temp, "rb") as handle:
        os.fsync(handle.fileno())
    # a journal left beside a store that is gone (deleted by hand with its creation stopped) would be "rolled
    # back" into the new one by the next SQLite that opens it
    _remove_sqlite_files(store, journals_only=True)
    os.replace(temp, store)
    with contextlib.suppress(OSError):  # the rename itself survives a power cut (a directory fsync, where it works)
        directory = os.open(store.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


@dataclass(frozen=True)
class _StoreState:
    """What an existing SQLite store holds, read with ``sqlite3`` before MLflow opens it."""

    path: Path
    head: str  # the newest schema revision of the installed MLflow
    revision: str | None  # alembic_version's row: the last migration that finished, None: none did
    leftovers: tuple[str, ...]  # alembic's _alembic_tmp_* copies that a stopped batch migration left
    rows: dict[str, int]  # rows per table with any (seeded tables left out); read only for a store not at head

    def problem(self) -> str | None:
        """The one line that refuses the store, or None when MLflow can use it (complete, or an older MLflow's
        complete store, which MLflow migrates itself)."""
        if self.revision == self.head and not self.leftovers:
            return None
        where = f"{self.path.absolute()}"
        left = self.leftovers
        stopped = (f"its schema is at revision {self.revision or 'none'}, not {self.head}"
                   + (f", and the stopped migration left the table{'s' * (len(left) > 1)} {', '.join(left)}"
                      if left else ""))  # fmt: skip
        if not self.rows:
            return (f"the MLflow store {where} is half-made: its creation was stopped during MLflow's schema "
                    f"migration ({stopped}); it holds no runs, experiments or models: delete it and run again (a "
                    "new store is then created complete)")  # fmt: skip
        if left or self.revision is None:
            held = ", ".join(f"{t.replace('_', ' ')} {max(self.rows.get(t, 0), self.rows.get(_ALEMBIC_TEMP + t, 0))}"
                             for t in ("experiments", "runs", "registered_models"))  # a copy being made holds them too
            return (f"the MLflow store {where} is half-migrated ({stopped}) and may hold runs ({held}), so it was "
                    "left as it is: restore it from a backup, or repair it (drop the leftover tables, then "
                    f"`mlflow db upgrade sqlite:///{self.path.absolute()}`), or point tracking.uri / "
                    "MLFLOW_TRACKING_URI at another store")  # fmt: skip
        return None  # an older MLflow's store with runs: MLflow migrates it when it opens it


def _store_state(store: Path) -> _StoreState | None:
    """The state of the SQLite file at ``store``; None when there is none or it holds no table (a file SQLite
    created and nothing wrote to: no store yet). Rows are counted only in a store whose schema is not complete
    (a complete store's tables are not scanned).

    Opening it as any SQLite reader does rolls back a transaction a stopped process left in its journal.

    Raises:
        StoreError: the file is no SQLite database.
    """
    import sqlite3

    from mlflow.store.db.utils import _get_latest_schema_revision

    if not store.exists():
        return None
    head = _get_latest_schema_revision()
    try:
        with contextlib.closing(sqlite3.connect(store, timeout=60)) as con:
            tables = sorted(r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
            if not tables:
                return None
            revision = None
            if "alembic_version" in tables:
                found = con.execute("SELECT version_num FROM alembic_version").fetchall()
                revision = found[0][0] if len(found) == 1 else None
            leftovers = tuple(t for t in tables if t.startswith(_ALEMBIC_TEMP))
            rows = {}
            for table in tables if revision != head or leftovers else ():
                base = table[len(_ALEMBIC_TEMP):] if table.startswith(_ALEMBIC_TEMP) else table
                if base in _SEEDED_TABLES or table.startswith("sqlite_"):
                    continue
                quoted = table.replace('"', '""')
                if (count := con.execute(f'SELECT COUNT(*) FROM "{quoted}"').fetchone()[0]) > 0:  # noqa: S608
                    rows[table] = count
    except sqlite3.DatabaseError as err:  # "file is not a database", "database disk image is malformed"
        if isinstance(err, sqlite3.OperationalError):  # locked, unreadable: MLflow says what it finds when it opens it
            raise
        raise StoreError(f"the MLflow store {store.absolute()} is no SQLite database MLflow can open ({err}); move "
                         "it away, or point tracking.uri / MLFLOW_TRACKING_URI at another store") from None  # fmt: skip
    return _StoreState(store, head, revision, leftovers, rows)


def sqlite_store_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` store; None for any other store (a server, PostgreSQL, files)."""
    return local_store_path(uri) if uri.startswith("sqlite:") else None


def local_store_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` store (or the folder of a ``file:`` store); None otherwise.

    As in SQLAlchemy, ``sqlite:///mlflow.db`` is relative to the working directory and
    ``sqlite:////srv/mlflow.db`` absolute.
    """
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        if "://" not in uri:  # sqlite:/x.db: no store MLflow reads (check_tracking_uri names the fix)
            return None
        path = unquote(uri.split("://", 1)[1].split("?", 1)[0])[1:]  # drop the '/' that ends the empty host
        return None if path in ("", ":memory:") else Path(path)
    if parsed.scheme in ("file", ""):
        return Path(unquote(parsed.path or uri))
    return None
