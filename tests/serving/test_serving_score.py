"""The scoring job's outcome: users it cannot rank are listed and counted; nothing ranked is an error; a full disk."""

from __future__ import annotations

import os

import mlflow
import polars as pl
import pytest
from serving_fixtures import read_rankings, score_config, snapshot, tiny_model, vocabulary, write_prepared

from recsys_alibi.config import with_overrides
from recsys_alibi.data import schema
from recsys_alibi.data.ingest import DataError
from serving import score as score_module
from serving.score import score_with_model


def _run(input_path, out, items=None, **score):
    return score_with_model(score_config(**score), tiny_model(), vocabulary() if items is None else items, input_path,
                            out, progress=False)  # fmt: skip


def test_model_of_another_catalog_is_refused_before_anything_is_scored(tmp_path):
    prepared = write_prepared(tmp_path / "prepared")
    other = vocabulary().with_columns((pl.col(schema.ITEM_ID) + 500_000).alias(schema.ITEM_ID))  # no id in common
    with pytest.raises(DataError) as caught:
        _run(prepared, tmp_path / "out", items=other)
    message = str(caught.value)
    assert message.startswith(f"none of the 30 items of {prepared} is in the model's vocabulary (30 of the model's 30 ids")
    assert "the model was trained on another catalog" in message
    assert not list((tmp_path / "out").glob("part-*.parquet"))


def test_a_model_whose_ids_overlap_the_input_by_chance_is_refused_above_the_unknown_share(tmp_path):
    """Item ids of two catalogs overlap by chance (integers from 1): most events unknown is another catalog."""
    prepared = write_prepared(tmp_path / "prepared")
    counts = list(range(1, 31))  # item 1000 + i has i events: 465 in all
    pl.read_parquet(prepared / "items.parquet").with_columns(pl.Series(schema.COUNT, counts, dtype=pl.Int64)).write_parquet(
        prepared / "items.parquet")  # fmt: skip
    model_items = vocabulary().with_columns(  # the model knows the input's items 1001..1010 only: 55 of 465 events
        pl.when(pl.col(schema.ITEM_IDX) <= 10).then(pl.col(schema.ITEM_ID)).otherwise(pl.col(schema.ITEM_ID) + 500_000)
        .alias(schema.ITEM_ID))  # fmt: skip
    with pytest.raises(DataError) as caught:
        _run(prepared, tmp_path / "out", items=model_items)
    assert str(caught.value) == (
        f"88% of the events of {prepared} (410 of 465) are on items the model does not know (20 of the input's 30 "
        "items; the model knows 30): it looks trained on another catalog; score with a model trained on this data, or "
        "set score.max_unknown_share=1 to rank on the known events anyway (now 0.5)")
    assert not (tmp_path / "out").exists()
    assert _run(prepared, tmp_path / "out", items=model_items, max_unknown_share=0.9).users == 23  # 88 % <= 90 %


def test_users_without_a_known_item_are_listed_with_the_reason_and_counted(tmp_path):
    prepared = write_prepared(tmp_path / "prepared", n_users=10)
    sequences = pl.read_parquet(prepared / schema.SEQUENCES_FILE)
    # the model lacks items 1..5; users 3 and 7 saw only those; user 8 has an empty history
    only_unknown = {3: [1, 2, 2], 7: [5]}
    rows = sequences.to_dicts()
    for user, history in only_unknown.items():
        rows[user][schema.ITEM_IDX], rows[user][schema.TIMESTAMP] = history, list(range(len(history)))
        rows[user][schema.LENGTH] = len(history)
    rows[8][schema.ITEM_IDX], rows[8][schema.TIMESTAMP], rows[8][schema.LENGTH] = [], [], 0
    pl.DataFrame(rows, schema=sequences.schema).write_parquet(prepared / schema.SEQUENCES_FILE)
    model_items = vocabulary().with_columns(
        pl.when(pl.col(schema.ITEM_IDX) <= 5).then(pl.col(schema.ITEM_ID) + 500_000).otherwise(pl.col(schema.ITEM_ID))
    )  # the same indices, but ids 1001..1005 are others: the input's items 1..5 are unknown
    result = _run(prepared, tmp_path / "out", items=model_items)
    assert (result.users, result.skipped_users, result.users_ranked, result.unknown_items) == (10, 3, 7, 5)
    skipped = pl.read_parquet(tmp_path / "out" / "_skipped" / "*.parquet").sort(schema.USER_ID)
    assert skipped.to_dicts() == [
        {schema.USER_ID: "u003", "reason": "no_known_item", "input_events": 3},
        {schema.USER_ID: "u007", "reason": "no_known_item", "input_events": 1},
        {schema.USER_ID: "u008", "reason": "no_events", "input_events": 0},
    ]
    assert set(read_rankings(tmp_path / "out")[schema.USER_ID]) == {f"u{u:03d}" for u in range(10)} - {"u003", "u007", "u008"}
    summary = result.summary()
    assert summary.startswith("ranked 7 of 10 users: ")
    assert f"users not ranked (no known item, no events, every event rejected or every item seen): 3 (listed in {tmp_path / 'out' / '_skipped'})" in summary


def test_a_user_who_has_seen_every_item_is_listed_not_silently_missing(tmp_path):
    prepared = write_prepared(tmp_path / "prepared", n_users=4)
    n_items = vocabulary().height  # 30
    rows = pl.read_parquet(prepared / schema.SEQUENCES_FILE).to_dicts()
    rows[2][schema.ITEM_IDX] = list(range(1, n_items + 1)) + [4]  # the whole catalog, one repeat
    rows[2][schema.TIMESTAMP] = list(range(n_items + 1))
    schema_of = pl.read_parquet(prepared / schema.SEQUENCES_FILE).schema
    pl.DataFrame(rows, schema=schema_of).write_parquet(prepared / schema.SEQUENCES_FILE)
    result = _run(prepared, tmp_path / "out")
    assert (result.users, result.skipped_users, result.users_ranked) == (4, 1, 3)
    skipped = pl.read_parquet(tmp_path / "out" / "_skipped" / "*.parquet")
    assert skipped.to_dicts() == [{schema.USER_ID: rows[2][schema.USER_ID], "reason": "every_item_seen", "input_events": 31}]
    assert set(read_rankings(tmp_path / "out")[schema.USER_ID]) == {r[schema.USER_ID] for r in rows} - {rows[2][schema.USER_ID]}
    # without seen-item exclusion the same user is ranked over the whole catalog
    again = _run(prepared, tmp_path / "all", exclude_seen=False)
    assert (again.skipped_users, again.users_ranked) == (0, 4)


def test_nothing_ranked_at_all_is_an_error(tmp_path):
    path = tmp_path / "users.parquet"
    pl.DataFrame({schema.USER_ID: ["a", "b"], schema.ITEM_IDX: pl.Series([[], None], dtype=pl.List(pl.Int32))}).write_parquet(path)
    with pytest.raises(DataError, match="no user was ranked: none of the 2 users has an event whose item the model knows and an item left"):
        _run(path, tmp_path / "out")
    assert pl.read_parquet(tmp_path / "out" / "_skipped" / "*.parquet")["reason"].to_list() == ["no_events", "no_events"]
    # no empty rankings that read as a result: no manifest, no part file; run again, the same error (not "complete")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["_skipped"]
    with pytest.raises(DataError, match="no user was ranked: none of the 2 users"):
        _run(path, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["_skipped"]


@pytest.mark.parametrize(
    ("users", "histories", "message"),
    [
        (pl.Series(["a", None, "c"]), [[1], [2], [3]], "1 rows have a null user_id (first: row 1)"),
        (pl.Series([1.0, 2.5, 3.0]), [[1], [2], [3]], "user_id is Float64, but user ids must be integers or strings"),
        (pl.Series(["a", "b", "a"]), [[1], [2], [3]], "1 rows repeat a user_id (e.g. 'a' in 2 rows)"),
        (pl.Series(["a", "b", "c"]), [[1], [2, -4], [3]], "1 negative entries in item_idx (first: row 1)"),
        (pl.Series(["a", "b", "c"]), [[1], [2], [None, 3]], "1 null entries in item_idx (first: row 2)"),
    ],
)
def test_bare_sequences_with_bad_keys_or_indices_are_refused(tmp_path, users, histories, message):
    path = tmp_path / "users.parquet"
    pl.DataFrame({schema.USER_ID: users, schema.ITEM_IDX: pl.Series(histories, dtype=pl.List(pl.Int32))}).write_parquet(path)
    with pytest.raises(DataError, match=f"^{path}: .*") as caught:
        _run(path, tmp_path / "out")
    assert message in str(caught.value)
    assert not list((tmp_path / "out").glob("part-*.parquet"))


@pytest.mark.parametrize(
    ("column", "values", "message"),
    [
        (schema.LENGTH, pl.Series([1, 2, 1, 0]), "length's value differs from the number of item_idx entries in 2 rows (first: row 1)"),
        (schema.TIMESTAMP, pl.Series([[5], [6, 7], [8], []]), "timestamp's list length differs from the number of "
                                                               "item_idx entries in 2 rows (first: row 1)"),
    ],
)
def test_a_length_or_timestamp_list_that_disagrees_with_the_history_is_refused(tmp_path, column, values, message):
    path = tmp_path / "users.parquet"
    histories = pl.Series([[1], [2, 3, 4], [3], [4]], dtype=pl.List(pl.Int32))
    frame = pl.DataFrame({schema.USER_ID: ["a", "b", "c", "d"], schema.ITEM_IDX: histories, column: values})
    frame.write_parquet(path)
    with pytest.raises(DataError) as caught:
        _run(path, tmp_path / "out")
    assert str(caught.value) == f"{path}: {message}; fix the file or drop the {column} column"
    agreeing = {schema.LENGTH: histories.list.len(), schema.TIMESTAMP: histories.list.eval(pl.element() * 10)}[column]
    frame.with_columns(agreeing.alias(column)).write_parquet(path)
    assert _run(path, tmp_path / "out").users == 4  # the same file, its column in agreement: scored


def test_a_refused_input_leaves_no_manifest_so_the_fixed_input_is_scored_there(tmp_path, monkeypatch):
    """A refused run holds no rankings: the same command with the input fixed is not "another job"."""
    path = tmp_path / "users.parquet"
    bad = pl.DataFrame({schema.USER_ID: ["a", "b", "a"], schema.ITEM_IDX: pl.Series([[1], [2], [3]], dtype=pl.List(pl.Int32))})
    bad.write_parquet(path)
    with monkeypatch.context() as killed:  # a run killed while reading its input leaves its manifest
        killed.setattr(score_module, "withdraw_manifest", lambda *args, **kwargs: None)
        with pytest.raises(DataError, match="repeat a user_id"):
            _run(path, tmp_path / "out")
    assert (tmp_path / "out" / "_manifest.json").is_file()
    with pytest.raises(DataError, match="repeat a user_id"):  # the same job refused again: withdrawn now
        _run(path, tmp_path / "out")
    assert (tmp_path / "out").is_dir() and not any((tmp_path / "out").iterdir())
    with pytest.raises(DataError, match="repeat a user_id"):
        _run(path, tmp_path / "new")
    assert not (tmp_path / "new").exists()  # created by the refused run, left empty: removed
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="repeat a user_id"):
        _run(path, tmp_path / "kept")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["notes.txt"]
    bad.with_columns(pl.Series(schema.USER_ID, ["a", "b", "c"])).write_parquet(path)  # fixed: another fingerprint
    for out in (tmp_path / "out", tmp_path / "kept"):
        result = _run(path, out)
        assert (result.users, result.shards, result.rows) == (3, 1, 30)  # K = 10 each
    events = tmp_path / "events.csv"  # raw events, every row rejected: the input report stays, no manifest
    events.write_text("user_id,item_id,timestamp\nu1,1001,-5\nu2,1002,-7\n")
    with pytest.raises(DataError):
        _run(events, tmp_path / "raw")
    assert not (tmp_path / "raw" / "_manifest.json").exists()
    events.write_text("user_id,item_id,timestamp\nu1,1001,5\nu2,1002,7\n")
    assert _run(events, tmp_path / "raw").rows == 20


def test_float_item_indices_are_refused(tmp_path):
    path = tmp_path / "users.parquet"
    pl.DataFrame({schema.USER_ID: ["a"], schema.ITEM_IDX: pl.Series([[1.7]], dtype=pl.List(pl.Float64))}).write_parquet(path)
    with pytest.raises(DataError, match="item_idx holds Float64, but item indices are integers"):
        _run(path, tmp_path / "out")


def _score_args_of_a_logged_model(tmp_path) -> list[str]:
    """``score`` arguments (all but ``--output``) for the tiny model logged to the test's MLflow store."""
    from recsys_alibi.config import load_config
    from recsys_alibi.tracking import log_ranker, setup_tracking

    prepared = write_prepared(tmp_path / "prepared")
    setup_tracking(load_config().tracking)
    with mlflow.start_run() as run:
        log_ranker(tiny_model(), vocabulary(), None, tmp_path / "model")
    return ["score", "--model-uri", f"runs:/{run.info.run_id}/model", "--input", str(prepared), "--quiet",
            "--set", "score.shard_users=5", "--set", "score.attention_backend=sdpa", "--set", "score.device=cpu"]


FULL_DEVICE = "/dev/full"  # Linux: every write fails with ENOSPC


@pytest.mark.skipif(not os.path.exists(FULL_DEVICE), reason="needs /dev/full (Linux)")
def test_full_disk_while_scoring_is_one_line_and_a_rerun_completes(tmp_path, mlflow_store, monkeypatch, capsys):
    from pipelines.cli import main

    args = _score_args_of_a_logged_model(tmp_path)
    assert main([*args, "--output", str(tmp_path / "clean")]) == 0
    capsys.readouterr()

    real = score_module.write_atomic
    calls = []

    def fill_disk(path, write):
        calls.append(path.name)
        if path.name == "part-00002.parquet":  # the disk is full from this shard on: a real Polars write error
            real(path, lambda tmp: pl.DataFrame({"a": list(range(100_000))}).write_parquet(FULL_DEVICE))
        real(path, write)

    monkeypatch.setattr(score_module, "write_atomic", fill_disk)
    out = tmp_path / "full"
    assert main([*args, "--output", str(out)]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert err == [f"error: cannot write {out}: No space left on device; what was being written was discarded and every "
                   "output is as it was before that write; free space and run the same command again"]
    assert sorted(p.name for p in out.glob("part-*.parquet")) == ["part-00000.parquet", "part-00001.parquet"]
    assert not list(out.glob(".*.tmp"))
    monkeypatch.setattr(score_module, "write_atomic", real)
    assert main([*args, "--output", str(out)]) == 0
    assert "(2 already done)" in capsys.readouterr().out
    assert snapshot(out) == snapshot(tmp_path / "clean")


def test_progress_speed_shows_the_mean_throughput_when_all_users_came_in_one_advance():
    from rich.progress import Progress

    clock = iter([0.0, 0.0, 4.0, 4.0, 4.0, 4.0])  # start at 0 s, all 1,000 users done at 4 s
    with Progress(get_time=lambda: next(clock), disable=True) as bar:
        task_id = bar.add_task("scoring users", total=1000)
        bar.start_task(task_id)
        bar.advance(task_id, 1000)
        task = bar.tasks[0]
        assert task.speed is None  # rich's windowed rate: one sample, hence the old "0 users/s"
        assert score_module._speed_label(task) == "250 users/s"


def test_an_overwrite_of_another_jobs_rankings_replaces_them_as_a_whole(tmp_path, mlflow_store, monkeypatch, capsys):
    """score.overwrite over other rankings: a run failing part-way leaves them byte for byte, the re-run puts the
    new job's rankings (equal to a scoring into a new folder) in their place, and no staging folder is left."""
    from pipelines.cli import main

    args = _score_args_of_a_logged_model(tmp_path)
    out = tmp_path / "out"
    assert main([*args, "--output", str(out), "--set", "score.k=3"]) == 0
    assert main([*args, "--output", str(tmp_path / "k2"), "--set", "score.k=2"]) == 0
    earlier, wanted = snapshot(out), snapshot(tmp_path / "k2")
    assert earlier != wanted
    capsys.readouterr()

    real = score_module.write_atomic

    def fails_at_the_second_shard(path, write):
        if path.name == "part-00001.parquet":
            raise OSError(28, "No space left on device", str(path))
        real(path, write)

    monkeypatch.setattr(score_module, "write_atomic", fails_at_the_second_shard)
    again = [*args, "--output", str(out), "--set", "score.k=2", "--set", "score.overwrite=true"]
    assert main(again) == 1
    assert snapshot(out) == earlier  # the earlier rankings, whole, while and after the new job failed
    monkeypatch.setattr(score_module, "write_atomic", real)
    assert main(again) == 0
    assert snapshot(out) == wanted
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no staging left beside
    assert f"-> {out};" in capsys.readouterr().out


def test_time_going_backwards_in_a_history_names_the_user_and_row(tmp_path):
    prepared = write_prepared(tmp_path / "in")
    sequences = pl.read_parquet(prepared / "sequences.parquet")
    sequences.with_columns(pl.when(pl.col("user_id") == "u017").then(pl.col("timestamp").list.reverse())
                           .otherwise(pl.col("timestamp")).alias("timestamp")).write_parquet(prepared / "sequences.parquet")  # fmt: skip
    with pytest.raises(DataError) as err:
        score_with_model(score_config(k=3), tiny_model(time_gap_buckets=6), vocabulary(), prepared, tmp_path / "out",
                         progress=False)  # fmt: skip
    assert str(err.value) == (f"{prepared / 'sequences.parquet'}: timestamps go backwards inside the history of user "
                              "'u017' (row 17); sort each history by time first")


def test_the_new_items_line_is_printed_only_when_the_table_held_a_new_item_or_a_rejected_row(tmp_path):
    """A feature model's score with an item table of known items only says nothing about new items."""
    from serving.score import ScoreJobResult

    result = ScoreJobResult(output_dir=tmp_path, users=3, shards=1, shards_skipped=0, rows=9, seconds=1.0,
                            new_items_source="prep")  # fmt: skip
    assert result.new_item_lines() == [] and "new items" not in result.summary()
    rejected = ScoreJobResult(output_dir=tmp_path, users=3, shards=1, shards_skipped=0, rows=9, seconds=1.0,
                              new_items_source="t.csv", new_items_rejected=2)  # fmt: skip
    assert rejected.new_item_lines() == [
        "new items ranked from their features alone (not in the model's vocabulary): 0 from t.csv; its rows rejected: 2 "
        f"(listed in {tmp_path / '_input' / 'item_rejects.parquet'}); ranking rows that hold one: 0"]


def test_users_whose_every_event_row_is_rejected_are_listed_and_counted(tmp_path):
    """Raw events: users 9999 and 9998 have only rows of unusable times (rejected): listed in _skipped/ with
    the reason every_event_rejected and counted among the input's users (they were in no list and no count)."""
    events = pl.DataFrame({"user_id": [1, 1, 2, 9999, 9999, 9998], "item_id": [1001, 1002, 1003, 1004, 1005, 1004],
                           "timestamp": [10, 20, 30, None, -5, None]})  # fmt: skip
    events.write_parquet(tmp_path / "events.parquet")
    result = _run(tmp_path / "events.parquet", tmp_path / "out")
    assert (result.users, result.skipped_users, result.users_ranked, result.rejected_rows) == (4, 2, 2, 3)
    assert result.summary().startswith("ranked 2 of 4 users: ")
    assert sorted(read_rankings(tmp_path / "out")[schema.USER_ID].unique().to_list()) == [1, 2]
    skipped = pl.read_parquet(tmp_path / "out" / "_skipped" / "*.parquet").sort(schema.USER_ID)
    assert skipped.to_dicts() == [
        {schema.USER_ID: 9998, "reason": "every_event_rejected", "input_events": 1},
        {schema.USER_ID: 9999, "reason": "every_event_rejected", "input_events": 2},
    ]
    again = _run(tmp_path / "events.parquet", tmp_path / "out")  # complete already: the same counts
    assert (again.users, again.skipped_users) == (4, 2)


def test_rejected_users_are_listed_when_the_input_names_its_user_column_otherwise(tmp_path):
    """A CSV whose user column is ``visitorid`` (``data.columns.user_id``): its rejects file keeps that name. The
    users whose every row was rejected are still listed (was: ColumnNotFoundError "user_id", exit 1)."""
    lines = ["visitorid,itemid,ts", "1,1001,10", "1,1002,20", "2,1003,30", "9999,1004,", "9999,1005,-5"]
    (tmp_path / "events.csv").write_text("\n".join(lines) + "\n")
    config = with_overrides(score_config(), data={"columns": {"user_id": "visitorid", "item_id": "itemid", "timestamp": "ts"}})
    result = score_with_model(config, tiny_model(), vocabulary(), tmp_path / "events.csv", tmp_path / "out", progress=False)
    assert (result.users, result.skipped_users, result.users_ranked, result.rejected_rows) == (3, 1, 2, 2)
    skipped = pl.read_parquet(tmp_path / "out" / "_skipped" / "*.parquet")
    assert skipped.to_dicts() == [{schema.USER_ID: 9999, "reason": "every_event_rejected", "input_events": 2}]


def test_an_input_error_found_in_a_later_shard_withdraws_what_the_job_wrote(prepared, tmp_path):
    """Shards of 5 users: user u012's times go backwards, found when shard 2 is read, after shards 0 and 1 are
    written. The refused run leaves nothing behind, in a new folder or one that was there, and the same command
    with the input fixed runs (was: refused as 'another job' by the partial folder it left)."""
    seq = pl.read_parquet(prepared / schema.SEQUENCES_FILE)
    (tmp_path / "in").mkdir()
    seq.with_columns(pl.when(pl.col(schema.USER_ID) == "u012").then(pl.col(schema.TIMESTAMP).list.reverse())
                     .otherwise(pl.col(schema.TIMESTAMP))).write_parquet(tmp_path / "in" / schema.SEQUENCES_FILE)  # fmt: skip
    vocabulary().write_parquet(tmp_path / "in" / schema.ITEMS_FILE)
    model = tiny_model(time_gap_buckets=6)
    (tmp_path / "there").mkdir()
    (tmp_path / "there" / "notes.txt").write_text("mine")
    for out in (tmp_path / "out", tmp_path / "there"):
        with pytest.raises(DataError, match=r"timestamps go backwards inside the history of user 'u012' \(row 12\)"):
            score_with_model(score_config(), model, vocabulary(), tmp_path / "in", out, progress=False)
    assert not (tmp_path / "out").exists() and os.listdir(tmp_path / "there") == ["notes.txt"]
    seq.write_parquet(tmp_path / "in" / schema.SEQUENCES_FILE)  # the input fixed
    fixed = score_with_model(score_config(), model, vocabulary(), tmp_path / "in", tmp_path / "out", progress=False)
    assert (fixed.users, fixed.shards, fixed.shards_skipped, fixed.users_ranked) == (23, 5, 0, 23)
