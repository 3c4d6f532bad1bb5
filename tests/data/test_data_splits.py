"""Leave-one-out and temporal splits on hand-built sequences."""

from __future__ import annotations

import polars as pl
import pytest

from recsys_alibi.data.splits import default_cutoff, leave_one_out, temporal_split


@pytest.fixture
def sequences() -> pl.DataFrame:
    items = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10], [11], [12, 13, 14, 15]]
    times = [[10, 20, 30, 40, 50], [15, 25, 35], [5, 60], [70], [1, 2, 3, 4]]
    return pl.DataFrame(
        {
            "user_id": ["a", "b", "c", "d", "e"],
            "item_idx": pl.Series(items, dtype=pl.List(pl.Int32)),
            "timestamp": pl.Series(times, dtype=pl.List(pl.Int64)),
            "length": pl.Series([len(x) for x in items], dtype=pl.Int32),
        }
    )


def _rows(df: pl.DataFrame) -> list[tuple]:
    assert df.schema["history"] == pl.List(pl.Int32) and df.schema["targets"] == pl.List(pl.Int32)
    return df.rows()


def test_leave_one_out_test(sequences):
    assert _rows(leave_one_out(sequences, "test")) == [
        ("a", [1, 2, 3, 4], [5]),
        ("b", [6, 7], [8]),
        ("c", [9], [10]),
        ("e", [12, 13, 14], [15]),
    ]  # d (one event) has no history


def test_leave_one_out_valid(sequences):
    assert _rows(leave_one_out(sequences, "valid")) == [
        ("a", [1, 2, 3], [4]),
        ("b", [6], [7]),
        ("e", [12, 13], [14]),
    ]


def test_leave_one_out_train(sequences):
    assert _rows(leave_one_out(sequences, "train")) == [
        ("a", [1, 2, 3], []),
        ("e", [12, 13], []),
    ]  # b would train on one item: no next-item pair


def test_leave_one_out_accepts_lazy_and_rejects_unknown_stage(sequences):
    assert leave_one_out(sequences.lazy(), "test").height == 4
    with pytest.raises(ValueError, match="stage"):
        leave_one_out(sequences, "holdout")  # type: ignore[arg-type]


def test_temporal_split(sequences):
    assert _rows(temporal_split(sequences, 35)) == [
        ("a", [1, 2, 3], [4, 5]),
        ("b", [6, 7], [8]),  # 35 >= cutoff goes to targets
        ("c", [9], [10]),
    ]  # d only after, e only before


def test_default_cutoff(sequences):
    # all 15 timestamps sorted: 1 2 3 4 5 10 15 20 25 30 35 40 50 60 70 (positions 0..14);
    # "lower" takes position floor(q * 14): 7 -> 20 for q = 0.5, 12 -> 50 for q = 0.9
    assert default_cutoff(sequences, 0.5) == 20
    assert default_cutoff(sequences) == 50
    with pytest.raises(ValueError):
        default_cutoff(sequences, 1.5)
