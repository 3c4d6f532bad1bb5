"""Split the users of a prepared directory between training processes; read only one part.

Under data-parallel training each of the W processes (ranks) trains on its own users. Which
rows of ``sequences.parquet`` a rank takes is decided from the ``length`` column alone (4 bytes
per user, read by every rank); the item lists are then read only from the Parquet row groups
that hold the rank's rows (:func:`read_sequence_rows`), so at 10^9 events a rank reads about
1/W of the data.

Rules (R = eligible rows in file order, W = world size, r = rank):

- training: ``q = ceil(|R| / W)`` rows per rank, the contiguous block ``R[r*q : (r+1)*q]``;
  blocks that come out short are filled by wrapping around to the start of R (as
  ``DistributedSampler`` pads), so every rank runs the same number of steps, which DDP needs.
- validation: contiguous blocks of ``|R| // W`` or ``|R| // W + 1`` rows, no padding (every
  user is counted exactly once when the ranks' metric sums are all-reduced).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from recsys_alibi.data.ingest import DataError
from recsys_alibi.data.prepared import PREPARE_AGAIN, PREPARE_ID_KEY, check_prepared, mixed_error, read_consistent, unreadable_error
from recsys_alibi.data.schema import LENGTH, SEQUENCES_FILE, TIMESTAMP
from recsys_alibi.data.sequences import SEQUENCES_SCHEMA, read_parquet_file
from recsys_alibi.data.splits import Protocol, fit_length, resolve_cutoff


def _check_world(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in [0, world_size), got rank={rank}, world_size={world_size}")


def train_part(rows: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """The training rows of ``rank``: a contiguous block, padded by wrap-around to equal size.

    Args:
        rows: (R,) int64 eligible row indices (ascending).
        rank, world_size: 0 <= rank < world_size.

    Returns:
        (ceil(R / W),) int64 row indices; empty when R is 0. Over all ranks every row of
        ``rows`` appears at least once and at most twice.

    Example: ``train_part(np.arange(5), 1, 2) -> [3, 4, 0]``.
    """
    _check_world(rank, world_size)
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0:
        return rows
    per_rank = -(-rows.size // world_size)
    return rows[(rank * per_rank + np.arange(per_rank)) % rows.size]


def valid_part(rows: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """The validation rows of ``rank``: contiguous blocks, sizes differ by at most one, no repeats.

    Args:
        rows: (R,) int64 eligible row indices.
        rank, world_size: 0 <= rank < world_size.

    Returns:
        (R // W or R // W + 1,) int64; the blocks of all ranks concatenate to ``rows``.
    """
    _check_world(rank, world_size)
    rows = np.asarray(rows, dtype=np.int64)
    bounds = np.linspace(0, rows.size, world_size + 1).round().astype(np.int64)
    return rows[bounds[rank] : bounds[rank + 1]]


def read_lengths(prepared_dir: str | Path, prepare_id: str | None = None) -> np.ndarray:
    """(U,) int64: the ``length`` column of ``sequences.parquet`` (the only column read).

    Raises:
        DataError: the file is missing, unreadable, ``length`` is not Int32, or the file is not
            from the directory's (or the given ``prepare_id``) prepare.
    """
    frame = _read_columns(prepared_dir, [LENGTH], prepare_id)
    return frame.get_column(LENGTH).to_numpy().astype(np.int64)


def read_fit_lengths(
    prepared_dir: str | Path, protocol: Protocol, cutoff: int | None = None, prepare_id: str | None = None
) -> np.ndarray:
    """(U,) int64: every user's fit prefix ``m`` (:func:`recsys_alibi.data.splits.fit_length`).

    Reads only ``length`` (leave-one-out) or ``timestamp`` (temporal; ``cutoff`` resolved).

    Raises:
        DataError: as :func:`read_lengths`.
    """
    if protocol == "leave_one_out":
        return np.maximum(read_lengths(prepared_dir, prepare_id) - 1, 0)
    frame = _read_columns(prepared_dir, [TIMESTAMP], prepare_id)
    return frame.select(fit_length(protocol, cutoff)).to_series().to_numpy().astype(np.int64)


def read_fit_cutoff(
    prepared_dir: str | Path, protocol: Protocol, cutoff: int | None = None, prepare_id: str | None = None
) -> int | None:
    """The temporal cutoff (seconds) training uses: ``cutoff``, or the data's default when None
    (:func:`recsys_alibi.data.splits.resolve_cutoff`); None under leave-one-out (nothing read).

    Raises:
        DataError: as :func:`read_timestamps`.
    """
    return resolve_cutoff(read_timestamps(prepared_dir, prepare_id), cutoff) if protocol == "temporal" else None


def read_timestamps(prepared_dir: str | Path, prepare_id: str | None = None) -> pl.DataFrame:
    """The ``timestamp`` list column of ``sequences.parquet`` alone (for :func:`resolve_cutoff`).

    Raises:
        DataError: as :func:`read_lengths` (``timestamp`` should be list<Int64>).
    """
    return _read_columns(prepared_dir, [TIMESTAMP], prepare_id)


def _read_columns(prepared_dir: str | Path, columns: list[str], prepare_id: str | None) -> pl.DataFrame:
    path = Path(prepared_dir) / SEQUENCES_FILE
    frame = read_consistent(prepared_dir, SEQUENCES_FILE, partial(read_parquet_file, columns=columns), prepare_id)
    wrong = [f"{c} should be {SEQUENCES_SCHEMA[c]}" for c in columns if frame.schema[c] != SEQUENCES_SCHEMA[c]]
    if wrong:
        raise DataError(f"{path} has the wrong schema ({'; '.join(wrong)}); {PREPARE_AGAIN}")
    return frame


def row_groups_of(path: str | Path, rows: np.ndarray) -> np.ndarray:
    """Sorted indices of the Parquet row groups of ``path`` that contain any of ``rows``."""
    meta = pq.ParquetFile(path).metadata
    starts = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= starts[-1]):
        raise IndexError(f"rows outside [0, {starts[-1]}) of {path}")
    return np.unique(np.searchsorted(starts, rows, side="right") - 1)


def read_sequence_rows(
    prepared_dir: str | Path, rows: np.ndarray, columns: list[str], prepare_id: str | None = None
) -> pl.DataFrame:
    """Rows ``rows`` of ``sequences.parquet``, in the given order, reading only their row groups.

    Args:
        prepared_dir: a prepared directory.
        rows: (B,) int64 row indices (repeats allowed).
        columns: columns to read (names from ``recsys_alibi.data.schema``).
        prepare_id: the prepare an earlier read of this job saw (None: the directory's own).

    Returns:
        B rows of ``columns``.

    Raises:
        DataError: the file is missing/unreadable, a column has another dtype than prepare
            writes, or the file is not from the directory's (or the given) prepare.
    """
    path = Path(prepared_dir) / SEQUENCES_FILE
    rows = np.asarray(rows, dtype=np.int64)
    expected = check_prepared(prepared_dir, prepare_id)
    try:
        parquet = pq.ParquetFile(path)
        found = (parquet.metadata.metadata or {}).get(PREPARE_ID_KEY.encode())
        groups = row_groups_of(path, rows)
        table = parquet.read_row_groups(groups.tolist(), columns=columns)
    except (OSError, ValueError) as err:
        raise unreadable_error(path, err) from None
    if expected is not None and (found is None or found.decode() != expected):  # this open file's own id
        raise mixed_error(path)
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    wrong = [c for c in columns if c in SEQUENCES_SCHEMA and frame.schema[c] != SEQUENCES_SCHEMA[c]]
    if wrong:
        raise DataError(f"{path} has the wrong schema ({', '.join(wrong)}); {PREPARE_AGAIN}")
    meta = parquet.metadata
    sizes = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    read_starts = np.concatenate([[0], np.cumsum(sizes[groups])])  # where each read group begins in ``frame``
    group_of_row = np.searchsorted(starts, rows, side="right") - 1
    position = np.searchsorted(groups, group_of_row)
    local = read_starts[position] + rows - starts[group_of_row]
    return frame[local]
