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
targets = those with ``timestamp >= c``; only users with both are kept. A cutoff of 0 is a
cutoff (every event is at or after it), only None means "choose one" (:func:`resolve_cutoff`).

Training and validation under either protocol (:func:`fit_split`): the "fit prefix" of a user is
what the test may not hold out: the first ``m`` events, ``m = n - 1`` (leave-one-out: all but the
test event) or ``m = #{timestamp < c}`` (temporal: everything before the cutoff). Training uses
``items[: m - 1]`` (users with ``m >= 3``), validation predicts ``items[m - 1]`` from
``items[: m - 1]`` (``m >= 2``). For leave-one-out this is exactly ``leave_one_out(.., "train" /
"valid")``; for temporal no training input or target, and no validation target, is at or after
the cutoff. Baselines count the whole fit prefix (:func:`fit_prefix`).
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
MIN_FIT = {"train": 3, "valid": 2}  # shortest fit prefix m that takes part in a stage
PROTOCOLS = ("leave_one_out", "temporal")
Protocol = Literal["leave_one_out", "temporal"]


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
    before = fit_length("temporal", cutoff)
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


def resolve_cutoff(sequences: pl.DataFrame | pl.LazyFrame, cutoff: int | None) -> int:
    """``cutoff`` itself when given (0 included: it is a cutoff, not "unset"), else :func:`default_cutoff`."""
    return int(cutoff) if cutoff is not None else default_cutoff(sequences)


def fit_length(protocol: Protocol, cutoff: int | None = None) -> pl.Expr:
    """Per user, ``m``: how many of the first events training and validation may use (Int64).

    ``n - 1`` for leave-one-out; for temporal, the events with ``timestamp < cutoff`` (a prefix:
    events are in time order). Needs ``length`` (leave-one-out) or ``timestamp`` (temporal).

    Raises:
        ValueError: an unknown protocol, or temporal without a cutoff (resolve it first).
    """
    if protocol == "leave_one_out":
        return (pl.col(LENGTH).cast(pl.Int64) - 1).clip(lower_bound=0)
    if protocol == "temporal":
        if cutoff is None:
            raise ValueError("the temporal protocol needs a cutoff: resolve_cutoff(sequences, evaluate.temporal_cutoff)")
        return pl.col(TIMESTAMP).list.eval(pl.element() < cutoff).list.sum().cast(pl.Int64)
    raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")


def fit_split(
    sequences: pl.DataFrame | pl.LazyFrame,
    stage: Literal["train", "valid"],
    protocol: Protocol = "leave_one_out",
    cutoff: int | None = None,
) -> pl.DataFrame:
    """Training or validation examples of ``protocol`` (see the module docstring).

    Args:
        sequences: prepared sequences (``user_id``, ``item_idx``, ``length``; ``timestamp`` for
            temporal; ``time_gaps`` optional).
        stage: ``"train"`` (targets empty: all next-item pairs of the history) or ``"valid"``.
        protocol: ``"leave_one_out"`` or ``"temporal"``.
        cutoff: seconds since epoch (temporal only), already resolved.

    Returns:
        ``user_id``, ``history`` list<Int32>, ``targets`` list<Int32> (and ``history_time_gaps``),
        users with a fit prefix of at least ``MIN_FIT[stage]`` events, in input order.

    Raises:
        ValueError: unknown stage or protocol; temporal without a cutoff.
    """
    if stage not in MIN_FIT:
        raise ValueError(f"stage must be 'train' or 'valid', got {stage!r}")
    m = pl.col("_m")
    frame = _lazy(sequences)
    targets = pl.col(ITEM_IDX).list.slice(m - 1, 1 if stage == "valid" else 0)
    return (
        frame.with_columns(fit_length(protocol, cutoff).alias("_m"))
        .filter(m >= MIN_FIT[stage])
        .select(
            USER_ID,
            pl.col(ITEM_IDX).list.head(m - 1).cast(pl.List(pl.Int32)).alias(HISTORY),
            targets.cast(pl.List(pl.Int32)).alias(TARGETS),
            *_history_time_gaps(frame, m - 1),
        )
        .collect()
    )


def fit_prefix(
    sequences: pl.DataFrame | pl.LazyFrame, protocol: Protocol = "leave_one_out", cutoff: int | None = None
) -> pl.DataFrame:
    """Every user's fit prefix (all the test does not hold out): what a baseline may count.

    Returns:
        ``user_id``, ``history`` list<Int32> (first ``m`` items) and ``timestamp`` list<Int64>
        (their times), every user in input order (an empty prefix stays, as empty lists).
    """
    m = fit_length(protocol, cutoff)
    return (
        _lazy(sequences)
        .with_columns(m.alias("_m"))
        .select(
            USER_ID,
            pl.col(ITEM_IDX).list.head(pl.col("_m")).cast(pl.List(pl.Int32)).alias(HISTORY),
            pl.col(TIMESTAMP).list.head(pl.col("_m")).cast(pl.List(pl.Int64)).alias(TIMESTAMP),
        )
        .collect()
    )
