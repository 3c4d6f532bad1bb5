"""Evaluation splits of prepared sequences.

Every split returns ``user_id``, ``history`` list<Int32> (the items the model sees, in time
order) and ``targets`` list<Int32> (the items to predict).

Leave-one-out (per user, on the sequence of length ``n``):

======== =================== ============= ======================================
stage    history             targets       users kept
======== =================== ============= ======================================
train    items[: n - 2]      []            n >= 4 (at least one next-item pair)
valid    items[: n - 2]      [items[n-2]]  n >= 3 (non-empty history)
test     items[: n - 1]      [items[n-1]]  n >= 2 (non-empty history)
======== =================== ============= ======================================

Users too short for a stage are left out of that stage only.

Where the input has a ``time_gaps`` list column (``recsys_alibi.data.time_gaps``), both splits
also return ``history_time_gaps``: the buckets of the history's events, cut the same way.

Temporal (global cutoff ``c`` in seconds): history = the user's events with ``timestamp < c``,
targets = those with ``timestamp >= c``; only users with both are kept.
"""

from __future__ import annotations

from typing import Literal

import polars as pl

from recsys_alibi.data.schema import ITEM_IDX, LENGTH, TIME_GAPS, TIMESTAMP, USER_ID

HISTORY = "history"
TARGETS = "targets"
HISTORY_TIME_GAPS = "history_time_gaps"  # with a ``time_gaps`` input column: the history's gap buckets
STAGES = ("train", "valid", "test")
MIN_LENGTH = {"train": 4, "valid": 3, "test": 2}  # shortest sequence that takes part in a stage


def _lazy(sequences: pl.DataFrame | pl.LazyFrame) -> pl.LazyFrame:
    return sequences.lazy() if isinstance(sequences, pl.DataFrame) else sequences


def leave_one_out(
    sequences: pl.DataFrame | pl.LazyFrame, stage: Literal["train", "valid", "test"]
) -> pl.DataFrame:
    """Leave-one-out split for one stage (see the module docstring for the rules).

    Args:
        sequences: ``user_id``, ``item_idx`` list<Int32>, ``length`` Int32 (prepared sequences).
        stage: ``"train"``, ``"valid"`` or ``"test"``.

    Returns:
        ``user_id``, ``history`` list<Int32>, ``targets`` list<Int32>, in the input user order.
    """
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    items = pl.col(ITEM_IDX)
    n = pl.col(LENGTH)
    kept = n - 1 if stage == "test" else n - 2  # history length
    history = items.list.head(kept)
    targets = items.list.tail(1) if stage == "test" else items.list.slice(n - 2, 1 if stage == "valid" else 0)
    frame = _lazy(sequences)
    return (
        frame.filter(n >= MIN_LENGTH[stage])
        .select(
            USER_ID,
            history.cast(pl.List(pl.Int32)).alias(HISTORY),
            targets.cast(pl.List(pl.Int32)).alias(TARGETS),
            *_history_time_gaps(frame, kept),
        )
        .collect()
    )


def _history_time_gaps(frame: pl.LazyFrame, kept: pl.Expr) -> list[pl.Expr]:
    """``[time_gaps.list.head(kept) as history_time_gaps]`` where the input has time gaps, else []."""
    if TIME_GAPS not in frame.collect_schema().names():
        return []
    return [pl.col(TIME_GAPS).list.head(kept).cast(pl.List(pl.Int32)).alias(HISTORY_TIME_GAPS)]


def temporal_split(sequences: pl.DataFrame | pl.LazyFrame, cutoff: int) -> pl.DataFrame:
    """Global temporal split at ``cutoff`` (seconds): before -> history, at or after -> targets.

    Args:
        sequences: ``user_id``, ``item_idx`` list<Int32>, ``timestamp`` list<Int64> (sorted per user).
        cutoff: seconds since epoch, UTC.

    Returns:
        ``user_id``, ``history`` list<Int32>, ``targets`` list<Int32>; users with events on both sides.
    """
    before = pl.col(TIMESTAMP).list.eval(pl.element() < cutoff).list.sum().cast(pl.Int64)
    items = pl.col(ITEM_IDX)
    frame = _lazy(sequences)
    return (
        frame.with_columns(before.alias("_before"), items.list.len().alias("_n"))
        .filter((pl.col("_before") > 0) & (pl.col("_before") < pl.col("_n")))
        .select(
            USER_ID,
            items.list.head(pl.col("_before")).cast(pl.List(pl.Int32)).alias(HISTORY),
            items.list.slice(pl.col("_before")).cast(pl.List(pl.Int32)).alias(TARGETS),
            *_history_time_gaps(frame, pl.col("_before")),
        )
        .collect()
    )


def default_cutoff(sequences: pl.DataFrame | pl.LazyFrame, quantile: float = 0.9) -> int:
    """The ``quantile`` of all event timestamps (an actual timestamp, lower interpolation)."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    value = (
        _lazy(sequences)
        .select(pl.col(TIMESTAMP).explode().quantile(quantile, interpolation="lower"))
        .collect()
        .item()
    )
    if value is None:
        raise ValueError("no events: cannot choose a temporal cutoff from empty sequences")
    return int(value)
