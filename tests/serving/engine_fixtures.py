"""Inputs shared by the pyfunc and Ray engine tests: histories as raw ids, rankings compared with score's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from recsys_alibi.data import schema


def raw_histories(prepared: Path, *, with_time: bool = False) -> pl.DataFrame:
    """The users of a prepared dir as the pyfunc takes them: ``user_id``, ``item_id`` raw lists (``timestamp``)."""
    items = pl.read_parquet(prepared / schema.ITEMS_FILE).select(schema.ITEM_IDX, schema.ITEM_ID)
    seq = pl.read_parquet(prepared / schema.SEQUENCES_FILE)
    ids = items.sort(schema.ITEM_IDX).get_column(schema.ITEM_ID)
    lookup = pl.concat([pl.Series([None], dtype=ids.dtype), ids])
    lists = [lookup.gather(np.asarray(h, dtype=np.int64)).to_list() for h in seq.get_column(schema.ITEM_IDX).to_list()]
    frame = pl.DataFrame({schema.USER_ID: seq.get_column(schema.USER_ID),
                          schema.ITEM_ID: pl.Series(lists, dtype=pl.List(ids.dtype))})  # fmt: skip
    if with_time:
        frame = frame.with_columns(seq.get_column(schema.TIMESTAMP))
    return frame


def assert_same_rankings(got: pl.DataFrame, expected: pl.DataFrame, *, atol: float = 1e-5) -> None:
    """Same (user, rank) -> item rows, scores within ``atol``; both sorted by user and rank first."""
    key = [schema.USER_ID, schema.RANK]
    got, expected = got.sort(key), expected.sort(key)
    assert got.height == expected.height > 0
    assert got.select(key + [schema.ITEM_ID]).equals(expected.select(key + [schema.ITEM_ID]))
    assert got.get_column(schema.RANK).dtype == pl.Int32 and got.get_column(schema.SCORE).dtype == pl.Float32
    diff = np.abs(got.get_column(schema.SCORE).to_numpy() - expected.get_column(schema.SCORE).to_numpy())
    assert float(diff.max()) <= atol
