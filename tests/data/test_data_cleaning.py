"""Cleaning rules: min_value, exact duplicates, iterative k-core (against a plain lazy reference)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from recsys_alibi.data.cleaning import (
    dense_codes,
    drop_exact_duplicates,
    filter_min_value,
    k_core_mask,
    k_core_pass,
    sort_events,
    sort_permutation,
    sorted_duplicates,
)


def _events(rows: list[tuple]) -> pl.LazyFrame:
    return pl.LazyFrame(
        rows, schema={"user_id": pl.String, "item_id": pl.String}, orient="row"
    ).with_row_index("source_row").with_columns(pl.col("source_row").cast(pl.Int64))


# A..E users, x..z items. Round 1 drops C (1 event) and z (1 event), which leaves B with one
# event; round 2 drops B; then every user and item has 2 events: one pass is not enough.
KCORE = [("A", "x"), ("A", "y"), ("B", "x"), ("B", "z"), ("C", "y"), ("D", "x"), ("D", "y"), ("E", "x"), ("E", "y")]


def test_k_core_needs_two_rounds_and_stops_when_stable():
    lf = _events(KCORE)
    one = k_core_pass(lf, 2, 2).collect()
    assert one.select("user_id", "item_id").rows() == [("A", "x"), ("A", "y"), ("B", "x"), ("D", "x"), ("D", "y"), ("E", "x"), ("E", "y")]
    users = np.array([ord(u) - ord("A") for u, _ in KCORE])
    items = np.array([ord(i) - ord("x") for _, i in KCORE])
    keep, rounds = k_core_mask(users, items, 2, 2)
    assert rounds == 2
    assert [KCORE[i] for i in np.flatnonzero(keep)] == [("A", "x"), ("A", "y"), ("D", "x"), ("D", "y"), ("E", "x"), ("E", "y")]


def _k_core_reference(lf: pl.LazyFrame, min_user: int, min_item: int) -> pl.DataFrame:
    """Repeat the lazy one-round filter until the row count stops changing."""
    df = lf.collect()
    while True:
        nxt = k_core_pass(df.lazy(), min_user, min_item).collect()
        if nxt.height == df.height:
            return nxt
        df = nxt


def test_k_core_mask_matches_the_lazy_reference_on_random_data():
    rng = np.random.default_rng(0)
    for trial in range(5):
        n = 3000
        users = rng.zipf(1.5, n) % 300
        items = rng.zipf(1.3, n) % 200
        lf = pl.LazyFrame({"user_id": users, "item_id": items}).with_row_index("source_row")
        mu, mi = int(rng.integers(2, 6)), int(rng.integers(2, 6))
        ref = _k_core_reference(lf, mu, mi)
        keep, _ = k_core_mask(users, items, mu, mi)
        assert np.flatnonzero(keep).tolist() == ref["source_row"].to_list(), trial


def test_k_core_thresholds_of_one_keep_everything():
    keep, rounds = k_core_mask(np.array([0, 1]), np.array([0, 0]), 1, 1)
    assert keep.all() and rounds == 0


def test_exact_duplicates_keep_the_first_source_row_and_nulls_compare_equal():
    lf = pl.LazyFrame(
        {
            "user_id": [1, 1, 1, 1, 1, 2],
            "item_id": [5, 5, 5, 5, 6, 5],
            "timestamp": [10, 10, 10, 11, 10, 10],
            "event_type": [None, None, "buy", None, None, None],
            "source_row": [0, 1, 2, 3, 4, 5],
        }
    )
    out = sort_events(drop_exact_duplicates(lf)).collect()
    # row 1 duplicates row 0 (null event types are equal); row 2 differs by event_type, row 3 by time
    assert out["source_row"].to_list() == [0, 2, 4, 3, 5]


def test_min_value_filter():
    lf = pl.LazyFrame({"value": [1.0, 4.0, 5.0, 3.5]})
    assert filter_min_value(lf, 4.0).collect()["value"].to_list() == [4.0, 5.0]
    assert_frame_equal(filter_min_value(lf, None).collect(), lf.collect())


def test_sort_events_keeps_source_order_for_equal_times():
    lf = pl.LazyFrame({"user_id": [2, 1, 1, 1], "timestamp": [5, 9, 3, 9], "source_row": [0, 1, 2, 3]})
    assert sort_events(lf).collect()["source_row"].to_list() == [2, 1, 3, 0]


def test_sorted_fast_paths_match_the_references():
    rng = np.random.default_rng(1)
    n = 5000
    lf = pl.LazyFrame(
        {
            "user_id": rng.integers(0, 50, n),
            "item_id": rng.integers(0, 20, n),
            "timestamp": rng.integers(0, 30, n),  # many ties and many exact duplicates
            "event_type": pl.Series(rng.choice(["a", "b", ""], n)).replace("", None),
            "source_row": np.arange(n),
        }
    )
    ordered = sort_events(lf).collect()
    fast = ordered.filter(~sorted_duplicates(ordered))
    reference = sort_events(drop_exact_duplicates(lf)).collect().select(fast.columns)
    assert fast.height < n
    assert_frame_equal(fast, reference)


def test_k_core_mask_in_chunks_matches_one_array(monkeypatch):
    import recsys_alibi.data.cleaning as cleaning

    rng = np.random.default_rng(2)
    users = (rng.zipf(1.5, 2000) % 200).astype(np.int32)
    items = (rng.zipf(1.3, 2000) % 100).astype(np.int32)
    whole, rounds = k_core_mask(users, items, 3, 3)
    monkeypatch.setattr(cleaning, "CHUNK", 7)  # many steps per chunk, and a ragged last step
    parts, parts_rounds = k_core_mask([users[:555], users[555:1234], users[1234:]], [items[:555], items[555:1234], items[1234:]], 3, 3)
    assert rounds >= 2 and parts_rounds == rounds
    assert np.array_equal(parts, whole)


@pytest.mark.parametrize("n_users", [40, 70_000])  # one and two 16-bit radix digits
@pytest.mark.parametrize("time_ordered", [True, False])
def test_sort_permutation_matches_the_three_key_sort(n_users, time_ordered):
    rng = np.random.default_rng(n_users)
    n = 200_000
    users = rng.integers(-5, n_users, n) * 3  # negative and sparse ids
    times = np.sort(rng.integers(0, 1000, n)) if time_ordered else rng.integers(0, 1000, n)
    lf = pl.LazyFrame({"user_id": users, "timestamp": times, "source_row": np.arange(n)})
    expected = sort_events(lf).collect()["source_row"].to_numpy()
    _, codes = dense_codes(pl.Series(users))
    assert np.array_equal(sort_permutation(codes, times), expected)


@pytest.mark.parametrize("time_ordered", [True, False])
def test_sort_permutation_orders_by_nanoseconds_within_a_second(time_ordered):
    rng = np.random.default_rng(3)
    n = 50_000
    users = rng.integers(0, 300, n)
    seconds = rng.integers(0, 20, n)
    nanos = rng.integers(0, 4, n) * 250_000_000  # many equal (second, ns) pairs: source order decides
    if time_ordered:
        order = np.lexsort((nanos, seconds))
        seconds, nanos = seconds[order], nanos[order]
    lf = pl.LazyFrame({"user_id": users, "timestamp": seconds, "_subsecond": nanos, "source_row": np.arange(n)})
    expected = sort_events(lf).collect()["source_row"].to_numpy()
    _, codes = dense_codes(pl.Series(users))
    assert np.array_equal(sort_permutation(codes, seconds, nanos), expected)
    if not time_ordered:  # seconds alone would lose the order within a second
        assert not np.array_equal(sort_permutation(codes, seconds), expected)
    duplicated = pl.LazyFrame({"user_id": [1, 1, 1], "item_id": [5, 5, 5], "timestamp": [9, 9, 9],
                               "_subsecond": [100, 900, 100], "source_row": [0, 1, 2]})
    assert sorted(drop_exact_duplicates(duplicated).collect()["source_row"].to_list()) == [0, 1]


@pytest.mark.parametrize("ids", [[7, -3, 7, 10**12, -3], [7, -3, 7, 40, -3], ["b", "a", "b", "ab", "a"], []])
def test_dense_codes_rank_the_distinct_ids(ids):  # table (small span), rank (sparse ints, strings), empty
    series = pl.Series("user_id", ids, dtype=pl.String if ids and isinstance(ids[0], str) else pl.Int64)
    distinct, codes = dense_codes(series)
    assert distinct.to_list() == sorted(set(ids)) and distinct.dtype == series.dtype
    assert codes.dtype == np.int32 and distinct.gather(codes).to_list() == ids
