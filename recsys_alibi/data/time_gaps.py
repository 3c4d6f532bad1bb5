"""Time-gap buckets: how long before each event its predecessor in the same history happened.

An optional second input of the ranker (``model.time_gap_buckets``), looked up in its own
torchrec table and added to the item vector. The gap of event t is ``timestamp[t] -
timestamp[t - 1]`` in seconds, bucketed on a log2 scale (TiSASRec, Li et al., WSDM 2020, uses
clipped intervals; log buckets follow the relative-time buckets of HSTU, Zhai et al., ICML 2024):

=========================== ======================================================
bucket                      meaning
=========================== ======================================================
0                           padding (no event)
1                           the first event of a history (no predecessor)
2 + floor(log2(1 + gap))    gap in seconds, capped at bucket ``n_buckets - 1``
=========================== ======================================================

So bucket 2 is a gap of 0 s, bucket 3 1-2 s, bucket 12 17-34 minutes, bucket 18 0.76-1.5 days,
bucket 19 1.5-3 days; with 32 buckets the last one holds every gap of 17 years or more. Buckets are computed on
whole histories, so a window cut out of a history keeps each event's true gap.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from recsys_alibi.data.loader import FlatSequences
from recsys_alibi.data.prepared import (
    LINE_ORDER_KEY,
    PREPARE_ID_KEY,
    parquet_footer,
    read_consistent,
    read_json_file,
    read_manifest,
)
from recsys_alibi.data.schema import ITEM_IDX, STATS_FILE, TIME_GAPS, TIMESTAMP

FIRST_EVENT = 1
MIN_BUCKETS = 3  # padding, first event, one gap bucket


def gap_buckets(timestamps: FlatSequences, n_buckets: int) -> FlatSequences:
    """Bucketed gap of every event to its predecessor in the same sequence.

    Args:
        timestamps: U sequences of int64 seconds, each in time order (prepared sequences are).
        n_buckets: table size including padding (0) and first-event (1) buckets; >= 3.

    Returns:
        FlatSequences with the same offsets, int64 values in 1..n_buckets - 1.

    Raises:
        ValueError: ``n_buckets`` < 3, or a sequence whose timestamps go backwards.
    """
    if n_buckets < MIN_BUCKETS:
        raise ValueError(f"time gaps need at least {MIN_BUCKETS} buckets (padding, first event, gaps), got {n_buckets}")
    ts, gaps, first = _gaps(timestamps)
    if (gaps[~first] < 0).any():
        raise ValueError("timestamps go backwards inside a history; sort each history by time first")
    buckets = 2 + np.floor(np.log2(1.0 + np.maximum(gaps, 0))).astype(np.int64)
    buckets = np.where(first, FIRST_EVENT, np.minimum(buckets, n_buckets - 1))
    return FlatSequences(values=buckets, offsets=timestamps.offsets)


def _gaps(timestamps: FlatSequences) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(seconds, gap to the previous event, is first of its sequence)``, each ``(E,)``."""
    ts = timestamps.values.astype(np.int64)
    gaps = np.diff(ts, prepend=ts[:1])  # (E,) seconds since the previous value
    first = np.zeros(ts.size, dtype=bool)
    first[timestamps.offsets[:-1][timestamps.lengths() > 0]] = True
    return ts, gaps, first


def backwards_sequences(timestamps: FlatSequences) -> np.ndarray:
    """0-based indices ``(U',)`` int64 of the sequences whose timestamps go backwards somewhere."""
    _, gaps, first = _gaps(timestamps)
    events = np.flatnonzero((gaps < 0) & ~first)
    return np.unique(np.searchsorted(timestamps.offsets, events, side="right") - 1)


def checked_timestamps(sequences: pl.DataFrame) -> FlatSequences:
    """The ``timestamp`` lists of ``sequences``, checked against its ``item_idx`` lists.

    Raises:
        ValueError: no ``timestamp`` column, one that is not a list of integers, a null list or
            timestamp, or a user whose timestamp list is not as long as its item list.
    """
    if TIMESTAMP not in sequences.columns:
        raise ValueError(f"time gaps need a '{TIMESTAMP}' list column beside '{ITEM_IDX}'")
    column = sequences.get_column(TIMESTAMP)
    if not isinstance(column.dtype, pl.List) or not column.dtype.inner.is_integer():
        raise ValueError(f"'{TIMESTAMP}' must be a list of integer seconds per user, got {column.dtype}")
    if column.null_count() or bool(column.list.eval(pl.element().is_null().any()).explode().any()):
        raise ValueError(f"'{TIMESTAMP}' holds null lists or null timestamps; repair or drop those users")
    differ = column.list.len() != sequences.get_column(ITEM_IDX).list.len()
    if bool(differ.any()):
        first = int(differ.arg_true()[0])
        raise ValueError(
            f"{int(differ.sum())} user(s) have a '{TIMESTAMP}' list of another length than their "
            f"'{ITEM_IDX}' list (first: row {first}); one timestamp per event is needed"
        )
    return FlatSequences.from_series(column)


def with_time_gaps(sequences: pl.DataFrame, n_buckets: int) -> pl.DataFrame:
    """Prepared sequences with a ``time_gaps`` list<Int32> column beside ``item_idx``.

    Raises:
        ValueError: see ``checked_timestamps``; ``n_buckets`` < 3.
    """
    flat = gap_buckets(checked_timestamps(sequences), n_buckets)
    lists = pa.LargeListArray.from_arrays(pa.array(flat.offsets), pa.array(flat.values.astype(np.int32)))
    return sequences.with_columns(pl.Series(TIME_GAPS, lists).cast(pl.List(pl.Int32)))


def has_real_timestamps(data_dir: str | Path, prepare_id: str | None = None) -> bool:
    """False when the prepared (or staged) data in ``data_dir`` took its time from line order.

    Such data (e.g. the SASRec ``user item`` format) has a gap of one "second" between all
    events, so time gaps would be made up and a time cutoff splits by file position;
    ``stats.json`` records it. True without a stats file, unless the directory's manifest lists one.

    Raises:
        DataError: the stats file is not from the directory's (or the given ``prepare_id``) prepare,
            or it is missing while the manifest lists it (a temporal cutoff would silently split by
            line position).
    """
    path = Path(data_dir) / STATS_FILE
    if not path.exists() and STATS_FILE not in ((read_manifest(data_dir) or {}).get("files") or {}):
        return True
    stats = read_consistent(data_dir, STATS_FILE, read_json_file, prepare_id)
    return not stats.get("time_from_line_order")


def sequences_have_real_timestamps(sequences: str | Path) -> bool:
    """False when a ``sequences.parquet`` took its time from line order.

    The file's Parquet footer says so wherever the file was copied byte for byte
    (``recsys_alibi.time_from_line_order``, written by ``prepare`` since 2026-12-06); otherwise its folder's
    ``stats.json`` decides (:func:`has_real_timestamps`), unless the file carries another prepare's id than the
    folder's manifest (a file placed in a foreign prepared folder speaks for itself). Not covered: a file
    rewritten by another tool (polars, pyarrow, pandas) loses the footer key, and one from an earlier prepare
    copied out alone says nothing; both count as real time.

    Raises:
        DataError: the file is missing or not Parquet; the folder's stats are unreadable or another
            prepare's (as :func:`has_real_timestamps`).
    """
    path = Path(sequences)
    footer = parquet_footer(path)  # read once: the line-order key and the file's own prepare id
    if footer.get(LINE_ORDER_KEY.encode()) == b"true":
        return False
    own = footer.get(PREPARE_ID_KEY.encode(), b"").decode() or None
    folder = (read_manifest(path.parent) or {}).get("prepare_id")
    if own is not None and folder is not None and own != folder:
        return True
    return has_real_timestamps(path.parent)


def check_time_protocol(data_dir: str | Path, protocol: str, prepare_id: str | None = None) -> None:
    """Refuse ``evaluate.protocol=temporal`` on data whose time came from line order (SASRec, S3-Rec).

    There a cutoff would split each file by line position, not by time (one user of a hundred
    evaluated, silently); ``train``, ``evaluate`` and ``pipeline`` check it before reading more.

    Raises:
        ValueError: one line naming the fix.
        DataError: as :func:`has_real_timestamps`.
    """
    if protocol == "temporal" and not has_real_timestamps(data_dir, prepare_id):
        raise ValueError(
            f"evaluate.protocol=temporal needs real timestamps, but {data_dir} has none (time came from line "
            f"order, {STATS_FILE}), so a cutoff would split by file position; use evaluate.protocol=leave_one_out"
        )


def check_real_timestamps(data_dir: str | Path, prepare_id: str | None = None) -> None:
    """Raise ValueError unless ``has_real_timestamps(data_dir, prepare_id)``."""
    if not has_real_timestamps(data_dir, prepare_id):
        raise ValueError(
            f"{data_dir} has no timestamps (time came from line order, {STATS_FILE}): "
            "model.time_gap_buckets needs a log with real timestamps; set it to 0"
        )


def sequences_for(model, sequences: pl.DataFrame) -> pl.DataFrame:
    """``sequences`` with the time-gap buckets ``model`` (an ``AlibiRanker``) reads, if it reads any."""
    buckets = getattr(getattr(model, "items", None), "time_gap_buckets", 0)
    return with_time_gaps(sequences, buckets) if buckets else sequences
