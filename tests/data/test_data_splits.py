"""Leave-one-out and temporal splits on hand-built sequences."""

from __future__ import annotations

import polars as pl
import pytest

from recsys_alibi.data.splits import default_cutoff, fit_prefix, fit_split, leave_one_out, resolve_cutoff, temporal_split


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


def test_fit_split_is_leave_one_out_for_train_and_valid(sequences):
    for stage in ("train", "valid"):
        assert fit_split(sequences, stage).equals(leave_one_out(sequences, stage))


def test_temporal_fit_split_stops_before_the_cutoff(sequences):
    # events before 35: a 10 20 30 (items 1 2 3), b 15 25 (6 7), c 5 (9), d none, e all four
    assert _rows(fit_split(sequences, "train", "temporal", 35)) == [("a", [1, 2], []), ("e", [12, 13, 14], [])]
    assert _rows(fit_split(sequences, "valid", "temporal", 35)) == [
        ("a", [1, 2], [3]), ("b", [6], [7]), ("e", [12, 13, 14], [15]),
    ]  # fmt: skip
    assert fit_prefix(sequences, "temporal", 35).rows() == [
        ("a", [1, 2, 3], [10, 20, 30]), ("b", [6, 7], [15, 25]), ("c", [9], [5]), ("d", [], []),
        ("e", [12, 13, 14, 15], [1, 2, 3, 4]),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="needs a cutoff"):
        fit_split(sequences, "train", "temporal")


def test_a_cutoff_of_zero_is_kept_and_none_takes_the_default(sequences):
    assert resolve_cutoff(sequences, 0) == 0
    assert resolve_cutoff(sequences, None) == default_cutoff(sequences)
    assert temporal_split(sequences, resolve_cutoff(sequences, 0)).height == 0
