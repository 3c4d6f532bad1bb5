"""Scoring inputs: raw events in a contract format, other vocabularies, bare sequence files."""

from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from serving_fixtures import read_rankings, score_config, tiny_model, vocabulary

from recsys_alibi.config import with_overrides
from recsys_alibi.data import schema
from recsys_alibi.data.ingest import DataError
from serving.inputs import input_kind
from serving.score import score_with_model

# user, item, timestamp: items 1001..1030 are known to the model, 9xxx are not
EVENTS = """user_id,item_id,timestamp
u1,1005,30
u1,1003,10
u1,9001,15
u1,1007,20
u2,1002,5
u2,9002,6
u2,9001,7
u2,1002,8
u3,1010,1
u3,1010,1
u3,1011,abc
u4,9003,3
u4,9004,4
"""


def _sequences(path, users: dict[str, list[int]]):
    path.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(
        {schema.USER_ID: list(users), schema.ITEM_IDX: pl.Series(list(users.values()), dtype=pl.List(pl.Int32))}
    ).write_parquet(path / schema.SEQUENCES_FILE)
    return path / schema.SEQUENCES_FILE


def test_raw_events_with_unknown_items(tmp_path):
    events = tmp_path / "events.csv"
    events.write_text(EVENTS)
    assert input_kind(events) == "events"
    result = score_with_model(score_config(k=5, shard_users=2), tiny_model(), vocabulary(), events, tmp_path / "out", progress=False)
    # the same users, time-ordered, known items only, in the model's indices (item_id - 1000);
    # u3's duplicate row is dropped and its bad-timestamp row rejected; u4 knows no item
    want_input = _sequences(tmp_path / "manual", {"u1": [3, 7, 5], "u2": [2, 2], "u3": [10]})
    score_with_model(score_config(k=5, shard_users=2), tiny_model(), vocabulary(), want_input, tmp_path / "want", progress=False)
    got, want = read_rankings(tmp_path / "out"), read_rankings(tmp_path / "want")
    assert got.equals(want)
    assert set(got[schema.USER_ID]) == {"u1", "u2", "u3"}
    assert (result.unknown_items, result.unknown_events, result.skipped_users, result.rejected_rows) == (4, 5, 1, 1)
    assert result.users == 4 and result.users_scored == 4
    assert "unknown items: 4 (5 events skipped)" in result.summary()
    # the staged events are released, the input report stays
    staged = tmp_path / "out" / "_input"
    assert sorted(p.name for p in staged.iterdir()) == ["_staged.json", schema.REJECTS_FILE, schema.STATS_FILE]
    assert pl.read_parquet(staged / schema.REJECTS_FILE)[schema.REJECT_REASON].to_list() == ["bad_timestamp"]


def test_prepared_dir_with_another_vocabulary_is_mapped_by_raw_id(prepared, tmp_path):
    score_with_model(score_config(), tiny_model(), vocabulary(), prepared, tmp_path / "a", progress=False)
    # the same histories under another numbering of the items, plus an item the model lacks
    other = tmp_path / "other"
    other.mkdir()
    vocab = vocabulary()
    reverse = {i: vocab.height + 1 - i for i in range(1, vocab.height + 1)}
    seq = pl.read_parquet(prepared / schema.SEQUENCES_FILE).with_columns(
        pl.col(schema.ITEM_IDX).list.eval(pl.element().replace_strict(reverse) ).cast(pl.List(pl.Int32))
    )
    seq = seq.with_columns(pl.col(schema.ITEM_IDX).list.concat(pl.lit([31], dtype=pl.List(pl.Int32))),
                           pl.col(schema.TIMESTAMP).list.concat(pl.col(schema.TIMESTAMP).list.last()),
                           pl.col(schema.LENGTH) + 1)  # fmt: skip
    seq.write_parquet(other / schema.SEQUENCES_FILE)
    pl.concat([
        vocab.with_columns(pl.col(schema.ITEM_IDX).replace_strict(reverse, return_dtype=pl.Int32)),
        pl.DataFrame({schema.ITEM_IDX: [31], schema.ITEM_ID: [5555], schema.COUNT: [1]}, schema=vocab.schema),
    ]).write_parquet(other / schema.ITEMS_FILE)
    result = score_with_model(score_config(), tiny_model(), vocabulary(), other, tmp_path / "b", progress=False)
    assert read_rankings(tmp_path / "a").equals(read_rankings(tmp_path / "b"))
    assert (result.unknown_items, result.unknown_events) == (1, 23)


def test_bare_sequences_file_must_fit_the_model(tmp_path):
    ok = _sequences(tmp_path / "ok", {"a": [1, 2], "b": [30]}).rename(tmp_path / "ok" / "users.parquet")
    assert input_kind(ok) == "sequences"
    result = score_with_model(score_config(k=3), tiny_model(), vocabulary(), ok, tmp_path / "out", progress=False)
    assert result.rows == 6
    bad = _sequences(tmp_path / "bad", {"a": [1, 31]}).rename(tmp_path / "bad" / "users.parquet")
    with pytest.raises(DataError, match="item index 31 but the model knows 30 items"):
        score_with_model(score_config(), tiny_model(), vocabulary(), bad, tmp_path / "out2", progress=False)


def test_missing_input_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="input not found"):
        score_with_model(score_config(), tiny_model(), vocabulary(), tmp_path / "nope", tmp_path / "out", progress=False)


def test_time_gap_model_reads_each_kept_events_true_gap(tmp_path):
    import numpy as np

    from recsys_alibi.data.loader import FlatSequences
    from serving.rank import ShardRanker

    events = tmp_path / "events.csv"
    events.write_text(EVENTS)
    model, config = tiny_model(time_gap_buckets=8), score_config(k=5, shard_users=2)
    score_with_model(config, model, vocabulary(), events, tmp_path / "out", progress=False)
    got = read_rankings(tmp_path / "out")
    # gaps over the whole input history, then unknown events dropped: u1 at 10, (15), 20, 30 s ->
    # first, 5 s, 5 s, 10 s -> buckets 1, (4), 4, 5; u2 at 5, (6), (7), 8 -> 1, (3), (3), 3; u3 first
    histories = FlatSequences(np.array([3, 7, 5, 2, 2, 10]), np.array([0, 3, 5, 6]))
    users = pl.Series(schema.USER_ID, ["u1", "u2", "u3"])
    ranker = ShardRanker(model, vocabulary(), config.score, 5)
    want, _ = ranker.rank(users, histories, FlatSequences(np.array([1, 4, 5, 1, 3, 1]), histories.offsets))
    assert_frame_equal(got.select(want.columns), want, check_exact=False, abs_tol=1e-6)  # other batch padding
    other, _ = ranker.rank(users, histories, FlatSequences(np.array([1, 2, 2, 1, 2, 1]), histories.offsets))
    assert (other["score"] - want["score"]).abs().max() > 1e-3  # the gaps reach the scores


def _score_gaps(path, out):
    return score_with_model(score_config(), tiny_model(time_gap_buckets=8), vocabulary(), path, out, progress=False)


def test_time_gap_model_needs_real_timestamps_one_per_event(tmp_path):
    path = _sequences(tmp_path / "seqs", {"u1": [3, 4]})
    with pytest.raises(DataError, match="no 'timestamp' list"):
        _score_gaps(path, tmp_path / "o1")
    scalar = tmp_path / "scalar" / schema.SEQUENCES_FILE
    scalar.parent.mkdir()
    pl.read_parquet(path).with_columns(pl.lit(5).alias(schema.TIMESTAMP)).write_parquet(scalar)
    with pytest.raises(DataError, match="list of integer seconds"):
        _score_gaps(scalar, tmp_path / "o2")
    short = tmp_path / "short" / schema.SEQUENCES_FILE
    short.parent.mkdir()
    ts = pl.Series(schema.TIMESTAMP, [[10]], dtype=pl.List(pl.Int64))  # two items, one timestamp
    pl.read_parquet(path).with_columns(ts).write_parquet(short)
    with pytest.raises(DataError, match="timestamp.s list length differs from the number of item_idx entries in 1 rows"):
        _score_gaps(short, tmp_path / "o3")
    # raw events whose time is their line order (SASRec text): staged, then refused
    log = tmp_path / "log.txt"
    log.write_text("1 1003\n1 1004\n2 1005\n")
    config = with_overrides(score_config(), data={"format": "sasrec"})
    with pytest.raises(DataError, match="line order"):
        score_with_model(config, tiny_model(time_gap_buckets=8), vocabulary(), log, tmp_path / "o4", progress=False)


def test_raw_events_keep_every_id_spelling_apart_from_the_models(tmp_path):
    # 1,100 rows of known integer items, then +1005 and 01005: other spellings, not item 1005
    rows = "".join(f"u{u % 7},{1001 + u % 30},{u}\n" for u in range(1100)) + "u1,+1005,2000\nu2,01005,2001\n"
    events = tmp_path / "events.csv"
    events.write_text("user_id,item_id,timestamp\n" + rows)
    # every user has seen all 30 items: rank them all (with seen items excluded nobody would be ranked)
    config = score_config(k=5, exclude_seen=False)
    result = score_with_model(config, tiny_model(), vocabulary(), events, tmp_path / "out", progress=False)
    assert (result.unknown_items, result.unknown_events, result.rejected_rows) == (2, 2, 0)
    assert (result.users_ranked, result.rows) == (7, 35)


def test_non_utf8_raw_events_are_a_data_error(tmp_path):
    events = tmp_path / "latin.csv"
    events.write_bytes("user_id,item_id,timestamp\nu1,1005,1\nu1,caf\xe9,2\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"is not UTF-8 text: byte 0xe9 at line 3"):
        score_with_model(score_config(k=5), tiny_model(), vocabulary(), events, tmp_path / "out", progress=False)


def test_negative_indices_never_wrap_around_the_remap_and_are_counted_unknown():
    import numpy as np

    from recsys_alibi.data.loader import FlatSequences
    from serving.inputs import map_histories

    remap = np.array([0, 7, 8, 9])  # input indices 1..3 -> model 7..9
    histories = FlatSequences(values=np.array([-1, 2, 0, -3, 5, 3]), offsets=np.array([0, 3, 6]))
    mapped, unknown = map_histories(histories, remap)
    assert mapped.values.tolist() == [8, 9] and mapped.offsets.tolist() == [0, 1, 2]
    assert unknown == 3  # -1, -3 and 5 (beyond the input vocabulary); the padding 0 is not counted
    identity, unknown = map_histories(histories, None)
    assert identity.values.tolist() == [2, 5, 3] and unknown == 2


def test_time_gap_sequences_in_milliseconds_rank_as_in_seconds_and_pre_epoch_times_are_refused(prepared, tmp_path):
    """A sequences Parquet follows prepare's time rule as the pyfunc does: ms (above 1e11) read as ms."""
    model = tiny_model(time_gap_buckets=12)
    seconds = pl.read_parquet(prepared / schema.SEQUENCES_FILE).with_columns(
        pl.col(schema.TIMESTAMP).list.eval(1_700_000_000 + 7 * pl.element() ** 2))  # gaps of 7 s .. 9 min  # fmt: skip
    variants = {"s": seconds, "ms": seconds.with_columns(pl.col(schema.TIMESTAMP).list.eval(pl.element() * 1000 + 999)),
                "negative": seconds.with_columns(pl.col(schema.TIMESTAMP).list.eval(pl.element() - 1_700_000_003))}  # fmt: skip
    for name, frame in variants.items():
        (tmp_path / name).mkdir()
        frame.write_parquet(tmp_path / name / schema.SEQUENCES_FILE)
        vocabulary().write_parquet(tmp_path / name / schema.ITEMS_FILE)
    for name in ("s", "ms"):
        score_with_model(score_config(), model, vocabulary(), tmp_path / name, tmp_path / f"out-{name}", progress=False)
    assert read_rankings(tmp_path / "out-ms").equals(read_rankings(tmp_path / "out-s"))
    with pytest.raises(DataError, match=r"sequences.parquet: \d+ timestamps before the epoch \(first: row 0\)"):
        score_with_model(score_config(), model, vocabulary(), tmp_path / "negative", tmp_path / "out-neg", progress=False)
    assert not (tmp_path / "out-neg").exists()
