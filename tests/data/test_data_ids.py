"""The id typing rule: Int64 only when every text id round-trips (recsys_alibi.data.ids)."""

from __future__ import annotations

import polars as pl

from recsys_alibi.data.ids import cast_integer_ids, integer_id_columns, round_trips


def test_round_trips_exactly_the_canonical_integer_spellings():
    values = ["7", "-5", "0", "9223372036854775807", "007", "+7", "-0", "7.0", " 7", "1e3", "9223372036854775808", "x"]
    got = pl.Series(values).to_frame("v").select(round_trips(pl.col("v"))).to_series().to_list()
    assert got == [True, True, True, True, False, False, False, False, False, False, False, False]


def test_one_other_spelling_anywhere_keeps_the_whole_column_text():
    n = 5000
    events = pl.LazyFrame({"user_id": [str(u) for u in range(n)], "item_id": [str(i % 9) for i in range(n - 1)] + ["09"]})
    assert integer_id_columns(events, ("user_id", "item_id")) == ["user_id"]
    typed = cast_integer_ids(events, ["user_id"]).collect()
    assert typed.schema["user_id"] == pl.Int64 and typed.schema["item_id"] == pl.String
    assert integer_id_columns(events, ()) == []
