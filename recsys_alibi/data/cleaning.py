"""Cleaning rules applied to canonical events, in this order.

1. ``min_value`` filter (optional): keep events with ``value >= data.min_value``.
2. Exact duplicates: rows equal in every canonical column (``user_id``, ``item_id``,
   ``timestamp`` at the source's full precision (seconds and ``_subsecond``) and, when present,
   ``event_type`` and ``value``; nulls compare equal) are collapsed to the first one in source
   order. Sorting, too, uses the full precision: events within one second keep their true order. Formats without timestamps never have duplicates
   (each line has its own time), so a repeated ``user item`` line is a re-consumption and is kept.
3. Iterative k-core: drop users with fewer than ``data.min_events_per_user`` events and items
   with fewer than ``data.min_events_per_item`` events, again and again until nothing changes
   (dropping an item can push a user below the threshold and the reverse).

Steps 1-2 are pure ``LazyFrame -> LazyFrame`` functions (``drop_exact_duplicates`` is the plain
group-by reference, ``sort_events`` the plain sort); ``prepare`` runs their fast paths on integer
codes: :func:`dense_codes`, :func:`sort_permutation` (a radix sort) and :func:`sorted_duplicates`
(a mask). The k-core needs the counts of each round, so :func:`k_core_mask` runs on integer codes
in numpy (two ``bincount`` per round); :func:`k_core_pass` is one round as a lazy transform, the
plain reference the tests hold :func:`k_core_mask` against.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from recsys_alibi.data.schema import EVENT_TYPE, ITEM_ID, SOURCE_ROW, SUBSECOND, TIMESTAMP, USER_ID, VALUE

EVENT_KEYS = (USER_ID, ITEM_ID, TIMESTAMP, SUBSECOND, EVENT_TYPE, VALUE)  # what makes two rows duplicates
CHUNK = 1 << 22  # events per step of the k-core loop


def filter_min_value(events: pl.LazyFrame, min_value: float | None) -> pl.LazyFrame:
    """Keep events with ``value >= min_value``; the identity when ``min_value`` is None."""
    if min_value is None:
        return events
    return events.filter(pl.col(VALUE) >= min_value)


def drop_exact_duplicates(events: pl.LazyFrame) -> pl.LazyFrame:
    """Collapse rows equal in every canonical column to the one with the lowest ``source_row``.

    Row order is not kept (sort afterwards with :func:`sort_events`).
    """
    names = events.collect_schema().names()
    keys = [name for name in EVENT_KEYS if name in names]
    return events.group_by(keys).agg(pl.col(SOURCE_ROW).min())


def sort_events(events: pl.LazyFrame) -> pl.LazyFrame:
    """Each user's events in time order (full precision); equal times keep the source order."""
    subsecond = [SUBSECOND] if SUBSECOND in events.collect_schema().names() else []
    return events.sort(USER_ID, TIMESTAMP, *subsecond, SOURCE_ROW)


def dense_codes(ids: pl.Series, max_span: int = 1 << 25) -> tuple[pl.Series, np.ndarray]:
    """The distinct ids in ascending order, and each row's position among them.

    Integer ids spanning at most ``max_span`` values go through a lookup table (no sort, 5 bytes
    per value of the span); other ids (strings, sparse integers) through a dense rank.

    Args:
        ids: (E,) Int64 or String ids without nulls.

    Returns:
        ``(distinct, codes)``: (U,) distinct ids ascending, and (E,) int32 codes with
        ``distinct[codes] == ids``.
    """
    if ids.dtype == pl.Int64 and ids.len():
        lo, hi = int(ids.min()), int(ids.max())  # type: ignore[arg-type]
        if hi - lo < max_span:
            offsets = ids.to_numpy() - lo
            seen = np.zeros(hi - lo + 1, dtype=bool)
            seen[offsets] = True
            codes = (np.cumsum(seen, dtype=np.int32) - 1)[offsets]
            return pl.Series(ids.name, np.flatnonzero(seen) + lo, dtype=pl.Int64), codes
    return ids.unique().sort(), (ids.rank("dense") - 1).cast(pl.Int32).to_numpy()


def sort_permutation(codes: np.ndarray, timestamps: np.ndarray, subseconds: np.ndarray | None = None) -> np.ndarray:
    """Fast path of :func:`sort_events` on dense user codes (:func:`dense_codes`), as a permutation.

    Rows must be in source order. A stable LSD radix sort on 16-bit digits of the code (numpy's
    stable argsort is a radix sort for 16-bit keys) orders by user; a first stable sort by time
    is skipped when the rows already are in time order, as logs usually are.

    Args:
        codes: (E,) int32 user codes (>= 0) in source order.
        timestamps: (E,) int64 seconds in source order.
        subseconds: (E,) int64 nanoseconds within the second, or None (all zero).

    Returns:
        (E,) int64 row order by (user, time, nanoseconds, source row).
    """
    if codes.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    step = np.diff(timestamps)
    if subseconds is None:
        in_order = bool((step >= 0).all())
    else:
        in_order = bool(((step > 0) | ((step == 0) & (np.diff(subseconds) >= 0))).all())
    order = None
    if not in_order:  # LSD: the finer key first, then the seconds (stable sorts)
        order = np.argsort(subseconds, kind="stable") if subseconds is not None else None
        by_time = np.argsort(timestamps if order is None else timestamps[order], kind="stable")
        order = by_time if order is None else order[by_time]
    if order is not None:
        codes = codes[order]
    perm = np.argsort((codes & 0xFFFF).astype(np.uint16), kind="stable")
    if int(codes.max()) > 0xFFFF:
        perm = perm[np.argsort((codes[perm] >> 16).astype(np.uint16), kind="stable")]
    return perm if order is None else order[perm]


def sorted_duplicates(events: pl.DataFrame) -> pl.Series:
    """Fast path of :func:`drop_exact_duplicates` on events sorted by :func:`sort_events`.

    Duplicates share user and time, so only rows whose (user, time) equals a neighbour's can be
    one; the distinctness test (hashing) runs on those candidates alone, which are few in real
    logs. The first of a group in sorted order has the lowest ``source_row``.

    Returns:
        (E,) Boolean, True for the rows to drop (``events.filter(~mask)`` is deduplicated).
    """
    keys = [name for name in EVENT_KEYS if name in events.columns]
    same = lambda k: (pl.col(USER_ID) == pl.col(USER_ID).shift(k)) & (pl.col(TIMESTAMP) == pl.col(TIMESTAMP).shift(k))  # noqa: E731
    candidate = events.select((same(1) | same(-1)).fill_null(False)).to_series()
    mask = np.zeros(events.height, dtype=bool)
    if candidate.any():
        repeated = events.filter(candidate).select(~pl.struct(keys).is_first_distinct()).to_series()
        mask[np.flatnonzero(candidate.to_numpy())[repeated.to_numpy()]] = True
    return pl.Series("duplicate", mask)


def k_core_pass(events: pl.LazyFrame, min_user: int, min_item: int) -> pl.LazyFrame:
    """One k-core round: drop events of users/items below the thresholds (counted on the input)."""
    return events.filter(
        (pl.len().over(USER_ID) >= min_user) & (pl.len().over(ITEM_ID) >= min_item)
    )


def k_core_mask(
    users: np.ndarray | Sequence[np.ndarray],
    items: np.ndarray | Sequence[np.ndarray],
    min_user: int,
    min_item: int,
) -> tuple[np.ndarray, int]:
    """Iterative k-core on integer codes.

    Args:
        users: (E,) non-negative int user code of each event, or a list of chunks of them
            (chunks are read in place, never concatenated).
        items: (E,) non-negative int item code of each event, chunked like ``users``.
        min_user: events a user needs to stay.
        min_item: events an item needs to stay.

    Returns:
        ``(keep, rounds)``: (E,) bool mask of the events in the k-core, and the number of rounds
        that removed events (0 when the input already is a k-core). Each round drops, at once,
        every event whose user or item is below its threshold given the previous round's
        counts; the fixed point does not depend on the order of removal.

    Example:
        >>> keep, rounds = k_core_mask(np.array([0, 0, 1]), np.array([0, 1, 0]), 2, 1)
        >>> keep.tolist(), rounds
        ([True, True, False], 1)
    """
    user_chunks = _chunks(users)
    item_chunks = _chunks(items)
    n = sum(c.shape[0] for c in user_chunks)
    keep = np.ones(n, dtype=bool)
    if n == 0 or (min_user <= 1 and min_item <= 1):
        return keep, 0
    n_users = max(int(c.max()) for c in user_chunks if c.size) + 1
    n_items = max(int(c.max()) for c in item_chunks if c.size) + 1
    # int32 counts: the per-event gathers below then take 4 bytes per event, not 8
    user_count = sum(np.bincount(c, minlength=n_users) for c in user_chunks).astype(np.int32)
    item_count = sum(np.bincount(c, minlength=n_items) for c in item_chunks).astype(np.int32)
    starts = np.cumsum([0] + [c.shape[0] for c in user_chunks])
    rounds = 0
    while True:
        user_drop = np.zeros_like(user_count)
        item_drop = np.zeros_like(item_count)
        removed = 0
        for k, (u, i) in enumerate(zip(user_chunks, item_chunks)):
            for lo in range(0, u.shape[0], CHUNK):  # bounded temporaries: CHUNK events at a time
                uu, ii = u[lo : lo + CHUNK], i[lo : lo + CHUNK]
                kept = keep[starts[k] + lo : starts[k] + lo + uu.shape[0]]  # a view: written in place
                bad = kept & ((user_count[uu] < min_user) | (item_count[ii] < min_item))
                if bad.any():
                    kept[bad] = False
                    user_drop += np.bincount(uu[bad], minlength=n_users).astype(np.int32)
                    item_drop += np.bincount(ii[bad], minlength=n_items).astype(np.int32)
                    removed += int(bad.sum())
        if removed == 0:
            return keep, rounds
        rounds += 1
        user_count -= user_drop
        item_count -= item_drop


def _chunks(codes: np.ndarray | Sequence[np.ndarray]) -> list[np.ndarray]:
    return [codes] if isinstance(codes, np.ndarray) else list(codes)
