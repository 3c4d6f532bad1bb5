"""Time-gap buckets: hand-computed values, splits that carry them, windows and batches that keep
them aligned with the items."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch

from recsys_alibi.data import schema
from recsys_alibi.data.errors import DataError
from recsys_alibi.data.loader import (
    FlatSequences,
    HistoryTargets,
    NextItemWindows,
    collate_history_targets,
    collate_next_item,
    collate_packed_next_item,
)
from recsys_alibi.data.splits import HISTORY_TIME_GAPS, leave_one_out, temporal_split
from recsys_alibi.data.time_gaps import (
    backwards_sequences,
    check_real_timestamps,
    gap_buckets,
    has_real_timestamps,
    sequences_for,
    with_time_gaps,
)

DAY = 86_400


def _flat(rows: list[list[int]]) -> FlatSequences:
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    return FlatSequences(values=np.array([v for r in rows for v in r], dtype=np.int64), offsets=offsets)


def test_buckets_by_hand():
    # gaps: first, 0 s, 1 s, 2 s, 3 s, 989 s, 2 days; user 2: first, 1 s; user 3: empty
    ts = _flat([[100, 100, 101, 103, 106, 1095, 1095 + 2 * DAY], [7, 8], []])
    got = gap_buckets(ts, 32)
    # 2 + floor(log2(1 + gap)): 0 s -> 2, 1 s -> 3, 2 s -> 3, 3 s -> 4, 989 s -> 11, 172800 s -> 19
    assert got.values.tolist() == [1, 2, 3, 3, 4, 11, 19, 1, 3]
    assert got.offsets.tolist() == ts.offsets.tolist()
    capped = gap_buckets(ts, 5)  # buckets 0..4: every gap of 3 s or more lands in 4
    assert capped.values.tolist() == [1, 2, 3, 3, 4, 4, 4, 1, 3]


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="at least 3"):
        gap_buckets(_flat([[1, 2]]), 2)
    with pytest.raises(ValueError, match="backwards"):
        gap_buckets(_flat([[5, 3]]), 8)
    # a later user may start before the previous one ended: not "backwards"
    assert gap_buckets(_flat([[50, 60], [10, 11]]), 8).values.tolist() == [1, 5, 1, 3]

    # which sequences go backwards: the second and the fourth (an equal time is not backwards)
    assert backwards_sequences(_flat([[1, 2], [9, 4, 5], [], [3, 3, 2, 1], [7]])).tolist() == [1, 3]
    assert backwards_sequences(_flat([[50, 60], [10, 11]])).tolist() == []


def _sequences() -> pl.DataFrame:
    return pl.DataFrame(
        {
            schema.USER_ID: [1, 2],
            schema.ITEM_IDX: pl.Series([[5, 6, 7, 8], [9, 3, 4]], dtype=pl.List(pl.Int32)),
            schema.TIMESTAMP: pl.Series([[0, 0, 1, 1 + DAY], [10, 13, 100]], dtype=pl.List(pl.Int64)),
            schema.LENGTH: pl.Series([4, 3], dtype=pl.Int32),
        }
    )


def test_bucket_lists_and_splits_carry_them():
    seqs = with_time_gaps(_sequences(), 32)
    # 86400 s: 2 + floor(log2(86401)) = 2 + 16 = 18; 3 s -> 4; 87 s -> 2 + 6 = 8
    assert seqs.get_column(schema.TIME_GAPS).to_list() == [[1, 2, 3, 18], [1, 4, 8]]
    assert seqs.schema[schema.TIME_GAPS] == pl.List(pl.Int32)
    test = leave_one_out(seqs, "test")
    assert test.get_column("history").to_list() == [[5, 6, 7], [9, 3]]
    assert test.get_column(HISTORY_TIME_GAPS).to_list() == [[1, 2, 3], [1, 4]]
    valid = leave_one_out(seqs, "valid")
    assert valid.get_column(HISTORY_TIME_GAPS).to_list() == [[1, 2], [1]]
    temporal = temporal_split(seqs, cutoff=12)
    assert temporal.get_column(HISTORY_TIME_GAPS).to_list() == [[1, 2, 3], [1]]
    assert HISTORY_TIME_GAPS not in leave_one_out(_sequences(), "test").columns  # no gaps in, none out
    with pytest.raises(ValueError, match="timestamp"):
        with_time_gaps(_sequences().drop(schema.TIMESTAMP), 32)


@pytest.mark.parametrize(
    ("timestamps", "match"),
    [
        (pl.Series([[0, 1, 2, 3], [1, 2]], dtype=pl.List(pl.Int64)), "another length .*first: row 1"),
        (pl.Series([[0, 1, None, 3], [1, 2, 3]], dtype=pl.List(pl.Int64)), "null"),
        (pl.Series([5, 6], dtype=pl.Int64), "must be a list"),
    ],
)
def test_timestamps_that_do_not_fit_the_items_raise(timestamps, match):
    with pytest.raises(ValueError, match=match):
        with_time_gaps(_sequences().with_columns(timestamps.alias(schema.TIMESTAMP)), 32)


def test_sequences_for_follows_the_model():
    class Items:
        time_gap_buckets = 16

    class Model:
        items = Items()

    assert schema.TIME_GAPS in sequences_for(Model(), _sequences()).columns
    assert sequences_for(object(), _sequences()).equals(_sequences())


def test_line_order_time_is_refused(tmp_path):
    (tmp_path / schema.STATS_FILE).write_text(json.dumps({"time_from_line_order": True}))
    with pytest.raises(ValueError, match="no timestamps"):
        check_real_timestamps(tmp_path)
    assert not has_real_timestamps(tmp_path)
    (tmp_path / schema.STATS_FILE).write_text(json.dumps({"time_from_line_order": False}))
    check_real_timestamps(tmp_path)
    assert has_real_timestamps(tmp_path) and has_real_timestamps(tmp_path / "no-stats-here")


def test_a_missing_stats_file_the_manifest_lists_is_refused(tmp_path):
    """Line-order data whose stats.json was deleted must not pass as real time (temporal split by line)."""
    (tmp_path / schema.MANIFEST_FILE).write_text(
        json.dumps({"state": "complete", "prepare_id": "p1", "files": {schema.STATS_FILE: 10}})
    )
    with pytest.raises(DataError, match="stats.json"):
        has_real_timestamps(tmp_path)


def _items_and_gaps() -> tuple[FlatSequences, FlatSequences]:
    items = _flat([[1, 2, 3, 4, 5, 6, 7], [8, 9], [3]])
    return items, FlatSequences(values=items.values * 10, offsets=items.offsets)  # gap = 10 x item


def test_windows_and_batches_keep_gaps_aligned():
    items, gaps = _items_and_gaps()
    windows = NextItemWindows(items, max_len=3, windows="all", gaps=gaps)
    samples = [windows[i] for i in range(len(windows))]
    assert [s.shape[0] for s in samples] == [2, 2, 2]  # (2, n): items over gaps; 7 events -> 2 windows of 3 + 1
    for s in samples:
        assert (s[1] == 10 * s[0]).all()
    batch = collate_next_item(samples)
    assert torch.equal(batch["gaps"], batch["inputs"] * 10)  # inputs' gaps, 0 at padding
    packed = collate_packed_next_item(samples, row_len=6)
    assert torch.equal(packed["gaps"], packed["inputs"] * 10)
    plain = collate_next_item([s[0] for s in samples])
    assert "gaps" not in plain and torch.equal(plain["inputs"], batch["inputs"])

    val = HistoryTargets(items, np.array([9, 1, 2]), max_len=4, gaps=gaps)
    vb = collate_history_targets([val[i] for i in range(len(val))])
    assert vb["history"].tolist() == [[4, 5, 6, 7], [8, 9, 0, 0], [3, 0, 0, 0]]
    assert torch.equal(vb["history_gaps"], vb["history"] * 10)


def test_misaligned_gaps_raise():
    items, _ = _items_and_gaps()
    other = _flat([[1, 1], [1, 1, 1, 1, 1, 1, 1], [1]])
    with pytest.raises(ValueError, match="offsets"):
        NextItemWindows(items, max_len=3, gaps=other)
    with pytest.raises(ValueError, match="offsets"):
        HistoryTargets(items, np.zeros(3), max_len=3, gaps=other)
