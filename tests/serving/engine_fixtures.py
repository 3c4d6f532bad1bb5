"""Inputs shared by the pyfunc and Ray engine tests: histories as raw ids, rankings compared with score's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from recsys_alibi.data import schema
from serving_fixtures import N_ITEMS, write_prepared


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


def ml1m_prepared(shared_data: Path, out: Path) -> Path:
    """ML-1M (SASRec file: 6,040 users, 3,416 items) prepared into ``out``."""
    from recsys_alibi.config import DataConfig
    from recsys_alibi.data.prepare import prepare

    result = prepare(DataConfig(min_events_per_user=5, min_events_per_item=5), shared_data / "ml-1m" / "ml-1m.txt.gz", out)
    assert (result.counts["users"], result.counts["items"]) == (6_040, 3_416)
    return out


ML1M_SCORE = {"k": 10, "shard_users": 1_000, "max_context": 200, "batch_size": 256, "catalog_chunk": 1_024}
"""``score`` settings of the ML-1M comparisons (histories beyond 200 events: the window with sinks)."""


SPELLED = ["007", "+7", "7", "u1"]  # three spellings, three users (docs/data.md): only "7" is the integer id 7


def spelled_prepared(path: Path) -> Path:
    """A prepared dir of the four text user ids of ``SPELLED``."""
    write_prepared(path, n_users=len(SPELLED))
    seq = pl.read_parquet(path / schema.SEQUENCES_FILE).with_columns(pl.Series(schema.USER_ID, SPELLED))
    seq.write_parquet(path / schema.SEQUENCES_FILE)
    return path


def user_7_rules(tmp_path: Path) -> tuple[str, str]:
    """A per-user deny file denying user 7 (an integer id) every item, and a per-user allow file
    (text ids) allowing user "7" items 1001..1005 and user "u1" every item."""
    every = list(range(1001, 1001 + N_ITEMS))
    pl.DataFrame({schema.USER_ID: [7] * N_ITEMS, schema.ITEM_ID: every}).write_parquet(tmp_path / "deny7.parquet")
    pl.DataFrame({schema.USER_ID: ["7"] * 5 + ["u1"] * N_ITEMS, schema.ITEM_ID: every[:5] + every}).write_parquet(
        tmp_path / "allow7.parquet")
    return str(tmp_path / "deny7.parquet"), str(tmp_path / "allow7.parquet")


def check_spelled_rules(deny_only: pl.DataFrame, allow_only: pl.DataFrame, plain: pl.DataFrame) -> None:
    """Rankings under the rules of :func:`user_7_rules`: user 7's rules apply to "7" only."""
    users = lambda frame: sorted(set(frame.get_column(schema.USER_ID).to_list()))  # noqa: E731
    of = lambda frame, user: frame.filter(pl.col(schema.USER_ID) == user)  # noqa: E731
    assert users(plain) == ["+7", "007", "7", "u1"]
    assert users(deny_only) == ["+7", "007", "u1"]  # "7" is denied every item; "007" and "+7" are not 7
    for user in ("007", "+7", "u1"):
        assert of(deny_only, user).equals(of(plain, user))
    assert users(allow_only) == ["7", "u1"]  # "007" and "+7" have no allow row: allowed nothing
    assert of(allow_only, "u1").equals(of(plain, "u1"))
    assert 0 < of(allow_only, "7").height <= 5 and set(of(allow_only, "7")[schema.ITEM_ID]) <= set(range(1001, 1006))
