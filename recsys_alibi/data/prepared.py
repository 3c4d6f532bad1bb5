"""The prepared directory as a whole: its manifest, the check every reader makes, publishing.

``prepare`` writes every output into a staging directory (``<dir>/.prepare-XXXX/``), then
publishes it: ``manifest.json`` is rewritten with ``"state": "publishing"``, the files are moved
into place with ``os.replace``, files of an earlier run that this one does not write are removed,
and ``manifest.json`` is rewritten last with ``"state": "complete"``. Every Parquet file carries
the run's ``prepare_id`` in its footer (key-value metadata ``recsys_alibi.prepare_id``) and
``stats.json`` holds it too.

Readers (:func:`read_consistent`) read the manifest, then the file, then the file's own id: a
directory with a manifest is read only when the manifest is complete and the file carries its
id, else a one-line :class:`DataError` says the directory is mixed or half-written. A kill
before publishing leaves the old directory as it was (still consistent); a kill while
publishing leaves a directory every reader refuses until ``prepare`` runs again. A directory
without ``manifest.json`` was not written by this version of ``prepare`` (hand-built, or older)
and is read as it is.

A reader that reads several files (or reads again later, another training process) passes the
id of its first read as ``prepare_id``; a prepare that completed in between is then refused too.

One ``prepare`` at a time per directory (an exclusive ``flock`` on the directory); holding it,
``prepare`` removes what killed runs left behind (``.prepare-*`` staging directories, hidden
``.<name>.*.tmp`` files of its outputs).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import polars as pl
import pyarrow.parquet as pq

from recsys_alibi.atomic import check_replaceable, describe_path, path_kind, publish_files, replace_file, write_json_atomic
from recsys_alibi.data.ids import same_id_in
from recsys_alibi.data.ingest import DataError
from recsys_alibi.data.schema import (
    CLEANED_FILE,
    EVENTS_FILE,
    ITEM_ID,
    ITEMS_FILE,
    MANIFEST_FILE,
    REJECTS_FILE,
    SEQUENCES_FILE,
    STATS_FILE,
)
from recsys_alibi.data.stats import HISTOGRAM_FILE
from recsys_alibi.staging import stale_temps

log = logging.getLogger(__name__)

PREPARE_ID_KEY = "recsys_alibi.prepare_id"  # Parquet footer key and stats.json field
LINE_ORDER_KEY = "recsys_alibi.time_from_line_order"  # Parquet footer key, b"true" when time is the line order
STAGING_PREFIX = ".prepare-"
PREPARE_AGAIN = (
    "run `recsys-alibi prepare` again with every input the directory was prepared from (without --append it "
    "replaces the whole directory, appended days included, with its --input alone)"
)  # the fix of a damaged prepared directory: never "prepare again" with only the last day
FINISH_PUBLISH = (
    "run the interrupted command again, with --append if it had none (same --input, --output and --config): "
    "it finishes the publish without losing anything and adds no file twice; without --append a prepare "
    "replaces the whole directory, appended days included, with its --input alone"
)  # the loss-free fix of a publish a kill interrupted (roll_forward)
FAILED_REJECTS_FILE = "rejects-failed.parquet"  # the rejects of a run that failed, beside older prepared data
ITEM_TABLE_FILES = ("item_features.parquet", "item_features_vocab.parquet", "item_rejects.parquet")  # data.item_features
OUTPUTS = (
    EVENTS_FILE, ITEMS_FILE, SEQUENCES_FILE, REJECTS_FILE, STATS_FILE, HISTOGRAM_FILE, FAILED_REJECTS_FILE, CLEANED_FILE,
    *ITEM_TABLE_FILES,
)  # fmt: skip
FINGERPRINT_FILES = (SEQUENCES_FILE, ITEMS_FILE)  # the data a model is trained on
OPTIONAL_FINGERPRINT_FILES = ITEM_TABLE_FILES[:2]  # also, when the directory has an item table
COMPLETE, PUBLISHING = "complete", "publishing"
T = TypeVar("T")


@contextmanager
def prepare_lock(directory: Path, command: str = "prepare") -> Iterator[None]:
    """Hold an exclusive ``flock`` on the directory itself for the block (released if the process dies).

    Args:
        command: the subcommand that writes ``directory`` (``prepare``; ``pipeline`` for its output folder).

    Raises:
        DataError: another ``command`` holds it (it is writing the same directory now).
    """
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataError(
                f"another `recsys-alibi {command}` is writing {directory} now; wait for it or choose another --output"
            ) from None
        yield
    finally:
        os.close(fd)  # releases the lock


def keep_failed_rejects(rejects: Path, directory: Path) -> Path:
    """Where the rejects of a prepare that failed go: ``rejects.parquet`` in a directory without
    prepared data, else ``rejects-failed.parquet`` beside the (untouched) prepared files."""
    prepared = (directory / MANIFEST_FILE).exists() or (directory / SEQUENCES_FILE).exists()
    target = directory / (FAILED_REJECTS_FILE if prepared else REJECTS_FILE)
    replace_file(rejects, target)
    return target


def clean_stale(directory: Path) -> list[Path]:
    """Remove staging directories and temporary files that killed runs left (hold the lock).

    Returns:
        The paths removed.
    """
    stale = [p for p in directory.glob(f"{STAGING_PREFIX}*") if p.is_dir()]
    stale += [p for name in (*OUTPUTS, MANIFEST_FILE) for p in stale_temps(directory / name)]
    for path in stale:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    if stale:
        log.info("removed %d leftover(s) of an interrupted prepare in %s", len(stale), directory)
    return stale


def publish(staging: Path, directory: Path, prepare_id: str) -> dict:
    """Move the staged outputs into ``directory`` and write its manifest last.

    Args:
        staging: holds this run's outputs (names from ``OUTPUTS``), each carrying ``prepare_id``.
        directory: the prepared directory (an earlier run's outputs there are replaced or removed).
        prepare_id: the run's id.

    Returns:
        The manifest written.
    """
    names = [name for name in OUTPUTS if (staging / name).is_file()]
    manifest = {
        "prepare_id": prepare_id,
        "files": {name: (staging / name).stat().st_size for name in names},
        "data_sha256": _fingerprint(staging),
    }
    for name in (MANIFEST_FILE, *OUTPUTS):  # a device or FIFO there: refused before anything is written
        check_replaceable(directory / name)
    manifest_path = directory / MANIFEST_FILE
    write_json_atomic(manifest_path, {**manifest, "state": PUBLISHING, "staging": staging.name})
    publish_files(staging, directory, OUTPUTS)  # an earlier run's file this one lacks (e.g. rejects) is removed
    manifest = {**manifest, "state": COMPLETE}
    write_json_atomic(manifest_path, manifest)
    return manifest


def roll_forward(directory: Path) -> bool:
    """Finish the publish a killed ``prepare`` or append began (hold the lock).

    The ``"publishing"`` manifest names the staging directory, whose files were complete before
    the first was moved: the ones still there are moved into place, the outputs that run did not
    write are removed, and the manifest is written ``"complete"``. An append calls this before it
    reads the directory, so a kill while publishing loses nothing (a full ``prepare`` simply
    replaces everything).

    Returns:
        True when an interrupted publish was finished.
    """
    path = directory / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
        staging = directory / manifest["staging"] if manifest["state"] == PUBLISHING else None
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if staging is None or not staging.is_dir() or not isinstance(manifest.get("files"), dict):
        return False
    for name in OUTPUTS:
        if name not in manifest["files"] and (directory / name).is_file():
            (directory / name).unlink()
    for name in manifest["files"]:
        if (staging / name).is_file():
            os.replace(staging / name, directory / name)
    write_json_atomic(path, {**{k: v for k, v in manifest.items() if k != "staging"}, "state": COMPLETE})
    log.info("finished publishing %s (a prepare was killed while replacing its files)", directory)
    return True


def cleaned_item_ids(directory: str | Path, id_dtype: pl.DataType | None = None) -> pl.DataFrame | None:
    """The distinct ``item_id`` of a prepared (or staging) directory's ``cleaned.parquet``: every item with an event
    before the k-core, so an item there and not in ``items.parquet`` is one the k-core removed. In ``id_dtype``
    when given, by the typing rule (:func:`recsys_alibi.data.ids.same_id_in`; an id of none of its ids dropped); None when the directory has no such file.

    Returns:
        One column ``item_id``, or None.
    """
    cleaned = Path(directory) / CLEANED_FILE
    if not cleaned.is_file():
        return None
    ids = pl.scan_parquet(cleaned).select(ITEM_ID).unique()
    if id_dtype is None:
        return ids.collect()
    source = pl.scan_parquet(cleaned).collect_schema()[ITEM_ID]  # 104 and "104" one id, "0104" none (data.ids)
    return ids.select(same_id_in(pl.col(ITEM_ID), source, id_dtype)).drop_nulls().collect()


def read_manifest(directory: str | Path) -> dict | None:
    """The manifest of a prepared directory; None when it has none (not written by ``prepare``).

    Raises:
        DataError: unreadable, or not complete (a prepare was interrupted while publishing).
    """
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
        state, prepare_id = manifest["state"], manifest["prepare_id"]
    except (OSError, ValueError, KeyError, TypeError):
        raise DataError(f"{path} is unreadable; {PREPARE_AGAIN}") from None
    if state != COMPLETE or not isinstance(prepare_id, str):
        raise DataError(
            f"{directory} is half-written (a `recsys-alibi prepare` was killed while replacing its files); {FINISH_PUBLISH}"
        )
    return manifest


def check_prepared(directory: str | Path, prepare_id: str | None = None) -> str | None:
    """The ``prepare_id`` of a complete prepared directory (None: no manifest, read as it is).

    Raises:
        DataError: see :func:`read_manifest`; or the directory holds another prepare than
            ``prepare_id`` (it was prepared again while being read).
    """
    manifest = _manifest_of(directory, prepare_id)
    return None if manifest is None else manifest["prepare_id"]


def _manifest_of(directory: str | Path, prepare_id: str | None) -> dict | None:
    """:func:`read_manifest`, refused when it names another prepare than ``prepare_id`` (when given)."""
    manifest = read_manifest(directory)
    if prepare_id is not None and (manifest is None or manifest["prepare_id"] != prepare_id):
        raise DataError(f"{directory} was prepared again while this job was reading it; run the job again")
    return manifest


def parquet_footer(path: Path) -> dict[bytes, bytes]:
    """The key-value metadata of a Parquet file's footer (``PREPARE_ID_KEY``, ``LINE_ORDER_KEY``, ...).

    Raises:
        DataError: the file is missing or not Parquet (:func:`unreadable_error`).
    """
    try:
        return pq.read_metadata(path).metadata or {}
    except (OSError, ValueError) as err:  # ArrowInvalid is a ValueError
        raise unreadable_error(path, err) from None


def file_prepare_id(path: Path) -> str | None:
    """The prepare id a prepared file carries (Parquet footer or ``stats.json``), None without one.

    Raises:
        DataError: the file is missing or unreadable (:func:`unreadable_error`), never reported
            as a mixed directory.
    """
    if path.suffix != ".json":
        raw = parquet_footer(path).get(PREPARE_ID_KEY.encode())
        return raw.decode() if raw is not None else None
    try:
        value = json.loads(path.read_text()).get(PREPARE_ID_KEY)
    except (OSError, ValueError, AttributeError) as err:
        raise unreadable_error(path, err) from None
    return value if isinstance(value, str) else None


def read_json_file(path: Path) -> dict:
    """A prepared JSON file (``stats.json``) as a dict.

    Raises:
        DataError: missing, unreadable, not JSON or not an object (:func:`unreadable_error`).
    """
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise unreadable_error(path, err) from None
    if not isinstance(value, dict):
        raise unreadable_error(path, ValueError(f"expected a JSON object, got {type(value).__name__}"))
    return value


def unreadable_error(path: Path, err: BaseException) -> DataError:
    """The one-line error of a prepared file that is missing or cannot be read (truncated, not Parquet)."""
    if not path.exists():
        kind = path_kind(path.parent)
        if kind not in (None, "directory"):  # --prepared names a file, a FIFO, ...: say so, not "not found"
            return DataError(f"{describe_path(path.parent)} is a {kind}, not a prepared directory; give the directory "
                             "`recsys-alibi prepare` wrote")  # fmt: skip
        return DataError(f"{path} not found; run `recsys-alibi prepare` to create the prepared directory")
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return DataError(f"cannot read {path}: {first}; {PREPARE_AGAIN}")


def mixed_error(path: Path) -> DataError:
    """The one-line error of a file that is not from the prepare its directory's manifest names."""
    return DataError(
        f"{path.parent} is mixed: {path.name} is not from the prepare its manifest names (written by "
        f"another program or prepare); {PREPARE_AGAIN}"
    )


def check_file(path: Path, prepare_id: str | None) -> None:
    """DataError unless ``path`` carries ``prepare_id`` (nothing to check when it is None)."""
    if prepare_id is not None and file_prepare_id(path) != prepare_id:
        raise mixed_error(path)


def read_consistent(directory: str | Path, name: str, read: Callable[[Path], T], prepare_id: str | None = None) -> T:
    """``read(directory / name)``, checked to belong to the directory's (or the given) prepare.

    Order: manifest, then the file, then the id in the file, so a file replaced at any moment
    in between is caught.

    Raises:
        DataError: see :func:`check_prepared` and :func:`check_file`.
    """
    found = check_prepared(directory, prepare_id)
    value = read(Path(directory) / name)
    check_file(Path(directory) / name, found)
    return value


def data_sha256(directory: str | Path, prepare_id: str | None = None) -> str:
    """Content fingerprint of the data a model trains on: sequences and vocabulary.

    From the manifest when there is one (computed once by ``prepare``), else computed. Equal for
    two prepares of the same events into any directory (:func:`parquet_content_sha256`).

    Raises:
        DataError: see :func:`check_prepared` (``prepare_id``: the prepare an earlier read of the
            job saw); a file is missing or unreadable.
    """
    manifest = _manifest_of(directory, prepare_id)
    if manifest is not None and isinstance(manifest.get("data_sha256"), str):
        return manifest["data_sha256"]
    return _fingerprint(Path(directory))


def _fingerprint(directory: Path) -> str:
    digest = hashlib.sha256()
    optional = [name for name in OPTIONAL_FINGERPRINT_FILES if (directory / name).is_file()]
    for name in (*FINGERPRINT_FILES, *optional):
        digest.update(name.encode())
        digest.update(parquet_content_sha256(directory / name).encode())
    return digest.hexdigest()


def parquet_content_sha256(path: Path) -> str:
    """sha256 of a Parquet file's rows: column names, dtypes and values, rows sorted by their scalar columns.

    Only the content counts, not the layout: the same rows in another order, other row groups or
    pages, another compression, or another prepare id in the footer hash the same (e.g. the same
    events prepared with another ``data.partition_rows``). 0.05 s for the ML-1M sequences (1M events).

    Raises:
        DataError: the file is missing or unreadable (:func:`unreadable_error`).
    """
    try:
        frame = pl.read_parquet(path)
    except (pl.exceptions.PolarsError, OSError) as err:
        raise unreadable_error(path, err) from None
    keys = [name for name, dtype in frame.schema.items() if not dtype.is_nested()]  # user_id (unique), item_idx ...
    frame = frame.sort(keys, maintain_order=True) if keys else frame
    digest = hashlib.sha256()
    for column in frame.get_columns():
        digest.update(f"{column.name}\0{column.dtype}\0".encode())
        _hash_values(digest, column.rechunk())
    return digest.hexdigest()


def _hash_values(digest, column: pl.Series) -> None:
    """Feed one column's values to ``digest`` in a form that does not depend on its memory layout."""
    if column.null_count():
        digest.update(column.is_null().to_numpy().tobytes())
    if isinstance(column.dtype, pl.List):
        digest.update(column.list.len().fill_null(0).cast(pl.Int64).to_numpy().tobytes())
        _hash_values(digest, pl.Series(column.to_arrow().flatten()))  # the elements of the non-null lists
    elif column.dtype == pl.String:
        digest.update(column.str.len_bytes().fill_null(0).cast(pl.Int64).to_numpy().tobytes())
        digest.update(column.fill_null("").str.join("").item().encode())
    elif column.dtype.is_numeric() or column.dtype.is_temporal() or column.dtype == pl.Boolean:
        digest.update(column.fill_null(0).to_numpy().tobytes())
    else:  # any other type (not in prepared files) by its text form
        _hash_values(digest, column.cast(pl.String))
