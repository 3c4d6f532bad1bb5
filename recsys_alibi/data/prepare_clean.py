"""Step B of ``prepare``: each user-hash partition cleaned in memory and held slim as integer codes.

:func:`clean_partition` (thread-safe, ``WORKERS`` partitions at a time) types the ids, applies
the ``min_value`` filter, replaces user and item ids by their ranks in the partition, sorts by
(user, time at full precision, source row) as a radix sort on the user codes and removes exact
duplicates (a user's events all live in one partition, so this is exact). ``prepare`` then
makes the codes global in partition order (:class:`ItemCoder`) and keeps each partition as a
:class:`Part` (Int32 user and item codes, timestamp, event type as an Enum, value: ~17-21 bytes
per event) for the k-core and the writers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from recsys_alibi.config import DataConfig
from recsys_alibi.data.cleaning import dense_codes, filter_min_value, sort_permutation, sorted_duplicates
from recsys_alibi.data.ids import cast_integer_ids
from recsys_alibi.data.schema import EVENT_TYPE, ITEM_ID, SOURCE_ROW, SUBSECOND, TIMESTAMP, USER_ID, VALUE

CODE = "_code"
USER_CODE = "_u"
ITEM_CODE = "_i"


@dataclass
class Part:
    """One user-hash partition after cleaning, held slim in memory (~20 bytes per event).

    Attributes:
        users: raw ids of the partition's users in sorted order.
        frame: one row per event (after the k-core: the events it kept), sorted by (user,
            time, source row): ``_u`` Int32 global user code (``user_offset`` + position in
            ``users``), ``_i`` Int32 item code, ``timestamp``, and ``event_type`` (Enum) and
            ``value`` when present.
        user_offset: global code of the partition's first user.
    """

    users: pl.Series
    frame: pl.DataFrame
    user_offset: int


class ItemCoder:
    """Dense Int32 codes of raw item ids, shared by all partitions (new ids get the next codes).

    ``prepare`` encodes the distinct items of each partition, in partition order, so the codes do
    not depend on thread timing. Integer ids spanning at most ``MAX_TABLE_SPAN`` values use a
    numpy lookup table (one gather per id); other ids (strings, sparse integers) a hash map.
    """

    MAX_TABLE_SPAN = 1 << 25

    def __init__(self) -> None:
        self._chunks: list[pl.Series] = []  # raw ids in code order
        self._n = 0
        self._base = 0
        self._table: np.ndarray | None = None
        self._hash: pl.DataFrame | None = None

    def ids(self) -> pl.Series:
        """Raw id of every code (position = code)."""
        return pl.concat(self._chunks) if self._chunks else pl.Series(ITEM_ID, [], dtype=pl.Int64)

    def encode(self, ids: pl.Series) -> np.ndarray:
        """(E,) int32 codes of ``ids`` (no nulls)."""
        if self._hash is None and ids.dtype == pl.Int64 and self._fit_table(ids):
            arr = ids.to_numpy()
            assert self._table is not None
            codes = self._table[arr - self._base]
            new = codes < 0
            if new.any():
                seen = np.zeros(self._table.shape[0], dtype=bool)
                seen[arr[new] - self._base] = True
                fresh = np.flatnonzero(seen) + self._base  # the new ids, sorted
                self._table[fresh - self._base] = np.arange(self._n, self._n + fresh.shape[0], dtype=np.int32)
                self._add(pl.Series(ITEM_ID, fresh, dtype=pl.Int64))
                codes = self._table[arr - self._base]
            return codes
        if self._hash is None:  # from now on: hash map (holding the codes given so far)
            self._hash = pl.DataFrame({ITEM_ID: self.ids().cast(ids.dtype), CODE: np.arange(self._n, dtype=np.int32)})
            self._table = None
        unique = ids.unique(maintain_order=True)
        fresh = unique.filter(~unique.is_in(self._hash[ITEM_ID].implode()))
        if fresh.len():
            self._add(fresh.rename(ITEM_ID))
            added = pl.DataFrame({ITEM_ID: fresh, CODE: np.arange(self._n - fresh.len(), self._n, dtype=np.int32)})
            self._hash = pl.concat([self._hash, added])
        return ids.replace_strict(self._hash[ITEM_ID], self._hash[CODE], return_dtype=pl.Int32).to_numpy()

    def _add(self, fresh: pl.Series) -> None:
        self._chunks.append(fresh)
        self._n += fresh.len()

    def _fit_table(self, ids: pl.Series) -> bool:
        lo, hi = int(ids.min()), int(ids.max())  # type: ignore[arg-type]
        if self._table is not None:
            lo, hi = min(lo, self._base), max(hi, self._base + self._table.shape[0] - 1)
            if lo == self._base and hi == self._base + self._table.shape[0] - 1:
                return True
        if hi - lo + 1 > self.MAX_TABLE_SPAN:
            return False
        table = np.full(hi - lo + 1, -1, dtype=np.int32)
        if self._table is not None:
            table[self._base - lo : self._base - lo + self._table.shape[0]] = self._table
        self._table, self._base = table, lo
        return True


def clean_partition(
    cfg: DataConfig, int_ids: list[str], files: list[Path]
) -> tuple[pl.Series, pl.Series, pl.DataFrame, int, pl.DataFrame]:
    """B for one partition: id types, min_value filter, local codes, sort, exact duplicates (thread-safe).

    ``int_ids`` are the text id columns that become Int64 (``ingest.integer_id_columns``).
    Events are sorted and de-duplicated with their ``_subsecond`` part, which is then dropped.

    Returns:
        ``(users, items, frame, n_after_min, cleaned)``: the partition's distinct user and item ids
        (ascending); its events after the min_value filter and the duplicate removal, sorted by
        (user, time, source row), with ``user_id`` and ``item_id`` replaced by their positions
        in ``users`` and ``items`` (Int32; bijections, so duplicates stay duplicates) and
        ``event_type`` as an Enum; the event count after the min_value filter; and the same
        events with their raw ids, ``_subsecond`` and ``source_row`` in the partition's row order
        (``cleaned.parquet``: an append that reads them back finds them in source order).
    """
    df = cast_integer_ids(filter_min_value(pl.scan_ipc(files), cfg.min_value), int_ids).collect()
    users, user_codes = dense_codes(df[USER_ID])
    timestamps = df[TIMESTAMP].to_numpy()
    subseconds = df[SUBSECOND] if SUBSECOND in df.columns and bool((df[SUBSECOND] != 0).any()) else None
    if df[SOURCE_ROW].is_sorted():
        perm = sort_permutation(user_codes, timestamps, None if subseconds is None else subseconds.to_numpy())
    else:
        keys = [df[SOURCE_ROW].to_numpy()] + ([] if subseconds is None else [subseconds.to_numpy()])
        perm = np.lexsort((*keys, timestamps, user_codes))
    items, item_codes = dense_codes(df[ITEM_ID])
    columns = [pl.Series(USER_ID, user_codes), pl.Series(ITEM_ID, item_codes), df[TIMESTAMP]]
    if EVENT_TYPE in df.columns:  # a partition-local Enum: 1-2 bytes per event, cheap to turn back into strings
        columns.append(df[EVENT_TYPE].cast(pl.Enum(df[EVENT_TYPE].unique().drop_nulls().sort())))
    if VALUE in df.columns:
        columns.append(df[VALUE])
    if subseconds is not None:
        columns.append(subseconds)
    frame = pl.DataFrame(columns).gather(perm)
    cleaned = df
    if cfg.drop_duplicates:  # sorted: the first of equal rows is the first in source order
        duplicate = sorted_duplicates(frame)
        if duplicate.any():
            frame = frame.filter(~duplicate)
            dropped = np.zeros(df.height, dtype=bool)
            dropped[perm[duplicate.to_numpy()]] = True
            cleaned = df.filter(~pl.Series(dropped))  # kept in the partition's row order: an append's fast path
    return users, items, frame.drop(SUBSECOND, strict=False), df.height, cleaned
