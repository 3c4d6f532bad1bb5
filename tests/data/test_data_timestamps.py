"""Raw timestamps -> (seconds, nanoseconds within the second), hand-computed (recsys_alibi.data.timestamps)."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from recsys_alibi.data.timestamps import has_subseconds, timestamp_parts


def _parts(values, unit="auto", dtype=None) -> list[tuple[int | None, int | None]]:
    frame = pl.DataFrame({"t": pl.Series(values, dtype=dtype)})
    seconds, ns = timestamp_parts("t", frame.schema["t"], unit)
    return frame.select(seconds.alias("s"), ns.alias("ns")).rows()


def test_integers_by_size_keep_the_fraction_of_a_second():
    assert _parts([1_700_000_000, 1_700_000_000_123, 1_700_000_000_123_456, 1_700_000_000_123_456_789]) == [
        (1_700_000_000, 0), (1_700_000_000, 123_000_000), (1_700_000_000, 123_456_000), (1_700_000_000, 123_456_789),
    ]
    assert _parts([5_001], unit="ms") == [(5, 1_000_000)]
    assert _parts([1_700_000_000_123], unit="s") == [(1_700_000_000_123, 0)]
    assert _parts([-1_500], unit="ms") == [(-2, 500_000_000)]  # floored: negative seconds are rejected later


def test_floats_strings_and_iso_fractions():
    assert _parts([1_700_000_000.25, 1_700_000_000_123.5]) == [(1_700_000_000, 250_000_000), (1_700_000_000, 123_500_000)]
    assert _parts(["1700000000900", "1700000000.5", "2024-01-02T03:04:05.123456Z", "2024-01-02", "x"]) == [
        (1_700_000_000, 900_000_000), (1_700_000_000, 500_000_000), (1_704_164_645, 123_456_000), (1_704_153_600, 0),
        (None, None),
    ]


@pytest.mark.parametrize("unit", ["ms", "us", "ns"])
def test_datetimes_at_their_own_resolution(unit):
    value = dt.datetime(2024, 1, 2, 3, 4, 5, 250_000)
    assert _parts([value], dtype=pl.Datetime(unit)) == [(1_704_164_645, 250_000_000)]
    assert _parts([dt.date(2024, 1, 2)]) == [(1_704_153_600, 0)]


def test_which_columns_can_carry_subseconds():
    assert not has_subseconds(pl.Int64, "s") and has_subseconds(pl.Int64, "auto") and has_subseconds(pl.Int64, "ms")
    assert has_subseconds(pl.String, "s") and has_subseconds(pl.Float64, "s") and has_subseconds(pl.Datetime("ms"), "s")
    assert not has_subseconds(pl.Date, "auto")
