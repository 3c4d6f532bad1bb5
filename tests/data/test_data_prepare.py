"""``prepare`` end to end on tiny inputs: sequences, vocabulary, accounting, files, readers."""

from __future__ import annotations

import json
import os
import random

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from recsys_alibi.config import ColumnMap, DataConfig, GenerateConfig
from recsys_alibi.data.ingest import DataError
from recsys_alibi.data.prepare import PrepareResult, prepare, read_items, read_sequences
from recsys_alibi.data.sequences import build_sequences, build_vocabulary
from recsys_alibi.data.synthetic import generate_events

LOOSE = DataConfig(min_events_per_user=1, min_events_per_item=1)


def test_ties_keep_source_order_and_string_ids(tmp_path):
    # u1: time 50 -> b (row 1), d (row 3); time 100 -> a (row 0), c (row 2)
    text = "user_id,item_id,timestamp\nu1,a,100\nu1,b,50\nu1,c,100\nu1,d,50\nu2,a,10\n"
    (tmp_path / "e.csv").write_text(text)
    prepare(LOOSE, tmp_path / "e.csv", tmp_path / "out")
    items = read_items(tmp_path / "out")
    # counts a=2, then b, c, d with 1 each in raw-id order
    assert items.rows() == [(1, "a", 2), (2, "b", 1), (3, "c", 1), (4, "d", 1)]
    seq = read_sequences(tmp_path / "out")
    assert seq.rows() == [("u1", [2, 4, 1, 3], [50, 50, 100, 100], 4), ("u2", [1], [10], 1)]
    events = pl.read_parquet(tmp_path / "out" / "events.parquet")
    assert events["item_id"].to_list() == ["b", "d", "a", "c", "a"]


@pytest.mark.parametrize(
    ("stamps", "parquet_type"),
    [
        (["1700000000900", "1700000000100", "1700000000100", "1700000000900", "1700000000900"], None),  # ms
        (["1700000000900000", "1700000000100000", "1700000000100000", "1700000000900000", "1700000000900000"], None),
        (["1700000000.9", "1700000000.1", "1700000000.1", "1700000000.9", "1700000000.9"], None),  # float seconds
        (["2023-11-14T22:13:20.9Z", "2023-11-14T22:13:20.1Z", "2023-11-14T22:13:20.1Z", "2023-11-14T22:13:20.9Z",
          "2023-11-14T22:13:20.9Z"], None),
        ([1700000000900, 1700000000100, 1700000000100, 1700000000900, 1700000000900], pl.Datetime("ms")),
    ],
)
def test_events_within_one_second_are_sorted_and_deduplicated_at_full_precision(tmp_path, stamps, parquet_type):
    # u1 clicks a at .9 s, b and c at .1 s, c again at .9 s (800 ms after the first c: not a duplicate),
    # and c at .9 s once more (an exact duplicate of row 3)
    items = ["a", "b", "c", "c", "c"]
    if parquet_type is None:
        (tmp_path / "e.csv").write_text("user_id,item_id,timestamp\n" + "".join(f"u1,{i},{t}\n" for i, t in zip(items, stamps)))
        source = tmp_path / "e.csv"
    else:
        frame = pl.DataFrame({"user_id": ["u1"] * 5, "item_id": items, "timestamp": pl.Series(stamps).cast(parquet_type)})
        frame.write_parquet(tmp_path / "e.parquet")
        source = tmp_path / "e.parquet"
    result = prepare(LOOSE, source, tmp_path / "out")
    assert result.counts["deduplicated"] == 1 and result.counts["events"] == 4
    events = pl.read_parquet(tmp_path / "out" / "events.parquet")
    assert events["item_id"].to_list() == ["b", "c", "a", "c"]  # .1 s before .9 s; equal times in source order
    assert events.schema["timestamp"] == pl.Int64 and set(events["timestamp"]) == {1_700_000_000}
    assert "_subsecond" not in events.columns
    seq = read_sequences(tmp_path / "out")
    assert seq["timestamp"].to_list() == [[1_700_000_000] * 4]


def test_two_file_orders_give_identical_outputs(tmp_path):
    rng = random.Random(0)
    rows = [(u, rng.randrange(30), t) for u in range(20) for t in rng.sample(range(10_000), 12)]
    for name, order in (("a", rows), ("b", rng.sample(rows, len(rows)))):
        lines = "".join(f"{u},{i},{t}\n" for u, i, t in order)
        (tmp_path / f"{name}.csv").write_text("user_id,item_id,timestamp\n" + lines)
        prepare(LOOSE, tmp_path / f"{name}.csv", tmp_path / f"out-{name}")
    assert_frame_equal(read_sequences(tmp_path / "out-a"), read_sequences(tmp_path / "out-b"))
    assert_frame_equal(read_items(tmp_path / "out-a"), read_items(tmp_path / "out-b"))


def test_vocabulary_by_count_then_raw_id():
    counts = pl.LazyFrame({"item_id": [10, 2, 7, 3], "count": [1, 2, 2, 5]})
    assert build_vocabulary(counts).collect().rows() == [(1, 3, 5), (2, 2, 2), (3, 7, 2), (4, 10, 1)]


def test_build_sequences_reference():
    events = pl.LazyFrame(
        {"user_id": [2, 1, 1], "item_idx": [3, 1, 2], "timestamp": [5, 7, 7], "source_row": [0, 2, 1]}
    )
    out = build_sequences(events).collect()
    assert out.rows() == [(1, [2, 1], [7, 7], 2), (2, [3], [5], 1)]
    assert out.schema == pl.Schema(
        {"user_id": pl.Int64, "item_idx": pl.List(pl.Int32), "timestamp": pl.List(pl.Int64), "length": pl.Int32}
    )


def test_accounting_identity_with_every_kind_of_loss(tmp_path):
    text = (
        "user_id,item_id,timestamp,rating\n"
        "1,1,10,5\n1,2,11,5\n1,3,12,5\n"  # user 1 ok
        "1,1,10,5\n"  # exact duplicate of row 0
        "1,2,13,1\n"  # rating below min_value
        "2,1,10,5\n2,2,11,5\n2,3,12,5\n"  # user 2 ok
        "3,1,10,5\n"  # user 3 has one event: k-core drops it
        "4,9,10,5\n4,9,11,5\n"  # item 9 only from user 4, but 2 events: kept (thresholds are 2)
        ",1,10,5\n"  # rejected: missing_user_id
        "5,1,nope,5\n"  # rejected: bad_timestamp
    )
    (tmp_path / "e.csv").write_text(text)
    cfg = DataConfig(columns=ColumnMap(value="rating"), min_value=4, min_events_per_user=2, min_events_per_item=2)
    result = prepare(cfg, tmp_path / "e.csv", tmp_path / "out")
    c = result.counts
    assert c == {
        "input_rows": 13,
        "rejected": 2,
        "deduplicated": 1,
        "filtered_min_value": 1,
        "filtered_kcore": 1,
        "filtered": 2,
        "kept": 8,
        "users": 3,
        "items": 4,
        "events": 8,
        "kcore_rounds": 1,
    }
    assert c["input_rows"] == c["kept"] + c["rejected"] + c["deduplicated"] + c["filtered"]
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert {k: stats[k] for k in c} == c
    assert stats["rejects_by_reason"] == {"bad_timestamp": 1, "missing_user_id": 1}
    assert stats["history_length"]["min"] == 2 and stats["history_length"]["max"] == 3
    assert stats["sparsity"] == pytest.approx(1 - 8 / 12)
    assert "8 events, 3 users, 4 items" in result.summary()
    assert isinstance(result, PrepareResult)


def test_output_files_are_complete_and_no_temporaries_remain(tmp_path):
    (tmp_path / "e.csv").write_text("user_id,item_id,timestamp\n1,1,1\n1,2,2\n,1,1\n")
    out = tmp_path / "out"
    prepare(LOOSE, tmp_path / "e.csv", out)
    names = sorted(os.listdir(out))
    assert names == [
        "cleaned.parquet", "events.parquet", "history_length.png", "items.parquet", "manifest.json", "rejects.parquet",
        "sequences.parquet", "stats.json",
    ]
    assert (out / "history_length.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a second run without bad rows removes the stale rejects file
    (tmp_path / "e.csv").write_text("user_id,item_id,timestamp\n1,1,1\n1,2,2\n")
    prepare(LOOSE, tmp_path / "e.csv", out)
    assert "rejects.parquet" not in os.listdir(out)
    assert not [n for n in os.listdir(out) if n.startswith(".")]


def test_user_hash_partitions_give_the_same_result(tmp_path):
    df = generate_events(GenerateConfig(users=200, items=80, min_events=5, max_events=200), seed=3)
    df = pl.concat([df, df.head(50)])  # some exact duplicates across the file
    df.write_parquet(tmp_path / "e.parquet")
    cfg = DataConfig(columns=ColumnMap(event_type="event_type"), min_events_per_user=3, min_events_per_item=3)
    one = prepare(cfg, tmp_path / "e.parquet", tmp_path / "one")
    many = prepare(cfg.model_copy(update={"partition_rows": 1000}), tmp_path / "e.parquet", tmp_path / "many")
    assert one.stats["partitions"] == 1 and many.stats["partitions"] > 3
    assert one.counts == many.counts and one.counts["deduplicated"] == 50
    assert_frame_equal(read_items(tmp_path / "one"), read_items(tmp_path / "many"))
    assert_frame_equal(read_sequences(tmp_path / "one"), read_sequences(tmp_path / "many").sort("user_id"))
    ev_one = pl.read_parquet(tmp_path / "one" / "events.parquet")
    ev_many = pl.read_parquet(tmp_path / "many" / "events.parquet")
    assert ev_one.columns == ["user_id", "item_id", "timestamp", "event_type"]
    assert_frame_equal(ev_one, ev_many.sort("user_id", maintain_order=True))


def test_sequences_match_a_naive_reference(tmp_path):
    df = generate_events(GenerateConfig(users=30, items=40, min_events=5, max_events=60), seed=1)
    df.write_parquet(tmp_path / "e.parquet")
    prepare(LOOSE, tmp_path / "e.parquet", tmp_path / "out")
    items = read_items(tmp_path / "out")
    idx = dict(zip(items["item_id"].to_list(), items["item_idx"].to_list()))
    seq = read_sequences(tmp_path / "out")
    expected: dict[int, list[tuple[int, int]]] = {}
    for row, (u, i, t) in enumerate(df.select("user_id", "item_id", "timestamp").iter_rows()):
        expected.setdefault(u, []).append((t, row, idx[i]))
    for u, items_, times, length in seq.iter_rows():
        ref = sorted(expected[u])
        assert items_ == [x[2] for x in ref] and times == [x[0] for x in ref] and length == len(ref)


def test_readers_fail_with_the_command_to_run(tmp_path):
    with pytest.raises(DataError, match="recsys-alibi prepare"):
        read_sequences(tmp_path)
    with pytest.raises(DataError, match="recsys-alibi prepare"):
        read_items(tmp_path)
    pl.DataFrame({"user_id": [1], "item_idx": [[1]], "timestamp": [[1]], "length": [1]}).write_parquet(
        tmp_path / "sequences.parquet"
    )
    with pytest.raises(DataError, match=r"item_idx should be List\(Int32\)"):
        read_sequences(tmp_path)


def test_item_coder_table_growth_and_hash_fallback():
    from recsys_alibi.data.prepare_clean import ItemCoder as _ItemCoder

    coder = _ItemCoder()
    assert coder.encode(pl.Series([10, 12, 10])).tolist() == [0, 1, 0]
    assert coder.encode(pl.Series([5, 12, 30])).tolist() == [2, 1, 3]  # the table grows both ways
    huge = _ItemCoder.MAX_TABLE_SPAN + 100
    assert coder.encode(pl.Series([huge, 5])).tolist() == [4, 2]  # too sparse: hash map from now on
    assert coder.encode(pl.Series([30, 7])).tolist() == [3, 5]
    assert coder.ids().to_list() == [10, 12, 5, 30, huge, 7]
    strings = _ItemCoder()
    assert strings.encode(pl.Series(["b", "a", "b"])).tolist() == [0, 1, 0]
    assert strings.encode(pl.Series(["c", "a"])).tolist() == [2, 1]
    assert strings.ids().to_list() == ["b", "a", "c"]


def test_string_ids_across_partitions(tmp_path):
    df = generate_events(GenerateConfig(users=150, items=60, min_events=5, max_events=100), seed=5)
    df = df.with_columns(pl.format("u{}", "user_id").alias("user_id"), pl.format("i{}", "item_id").alias("item_id"))
    df.write_parquet(tmp_path / "s.parquet")
    one = prepare(LOOSE, tmp_path / "s.parquet", tmp_path / "one")
    many = prepare(LOOSE.model_copy(update={"partition_rows": 1000}), tmp_path / "s.parquet", tmp_path / "many")
    assert many.stats["partitions"] > 1 and one.counts == many.counts
    assert read_items(tmp_path / "one").schema["item_id"] == pl.String
    assert_frame_equal(read_items(tmp_path / "one"), read_items(tmp_path / "many"))
    assert_frame_equal(read_sequences(tmp_path / "one"), read_sequences(tmp_path / "many").sort("user_id"))


@pytest.mark.parametrize("string_ids", [False, True])
def test_clean_partition_matches_the_reference_in_any_row_order(tmp_path, string_ids):
    from recsys_alibi.data.cleaning import drop_exact_duplicates, sort_events
    from recsys_alibi.data.prepare_clean import clean_partition as _clean_partition

    rng = random.Random(4)
    n = 3000
    df = pl.DataFrame(
        {
            "user_id": [rng.randrange(-40, 40) * 1000 for _ in range(n)],  # negative, sparse
            "item_id": [rng.randrange(20) for _ in range(n)],
            "timestamp": [rng.randrange(30) for _ in range(n)],  # many ties and duplicates
            "event_type": [rng.choice(["a", "b", None]) for _ in range(n)],
            "source_row": range(n),
        }
    )
    if string_ids:
        df = df.with_columns(pl.format("u{}", "user_id").alias("user_id"))
    reference = sort_events(drop_exact_duplicates(df.lazy())).collect()
    for name, rows in (("ordered", df), ("shuffled", df.sample(fraction=1.0, shuffle=True, seed=1))):
        rows.write_ipc(tmp_path / f"{name}.ipc")
        users, items, frame, n_after_min, cleaned = _clean_partition(DataConfig(), [], [tmp_path / f"{name}.ipc"])
        assert n_after_min == n and users.to_list() == sorted(set(df["user_id"]))
        got = frame.with_columns(
            users.gather(frame["user_id"]).alias("user_id"),
            items.gather(frame["item_id"]).alias("item_id"),
            pl.col("event_type").cast(pl.String),
        )
        assert_frame_equal(got, reference.select(got.columns))
        # the same events with raw ids, time and source row (cleaned.parquet, what an append merges into)
        assert_frame_equal(cleaned.select(reference.columns).sort("source_row"), reference.sort("source_row"))


@pytest.mark.parametrize(
    "unit, times, warned",
    [("ms", [874_724_710, 893_286_638], True),  # ML-100K seconds read as milliseconds: 1970-01-11
     ("s", [874_724_710, 893_286_638], False),
     ("ms", [874_724_710_000, 893_286_638_000], False),  # real milliseconds: 1998
     ("auto", [874_724_710, 893_286_638], False)],
)
def test_seconds_read_as_milliseconds_are_warned_of(tmp_path, caplog, unit, times, warned):
    rows = [f"u{u},i{i},{times[(u + i) % 2]}" for u in range(3) for i in range(3)]
    (tmp_path / "events.csv").write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    cfg = LOOSE.model_copy(update={"timestamp_unit": unit})
    with caplog.at_level("WARNING", logger="recsys_alibi.data.prepare"):
        result = prepare(cfg, tmp_path / "events.csv", tmp_path / "out")
    assert result.counts["events"] == 9  # a warning only: nothing is refused or dropped
    lines = [r.getMessage() for r in caplog.records if "timestamp_unit" in r.getMessage()]
    if warned:
        assert lines == ["data.timestamp_unit=ms: every event falls before 1973-03-03 (the newest at 1970-01-11 "
                         "08:08:06 UTC); if the timestamps are seconds, prepare again with data.timestamp_unit=s (or auto)"]
    else:
        assert lines == []
