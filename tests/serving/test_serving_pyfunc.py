"""The registered ranker as an MLflow pyfunc gives score's rankings and refuses bad frames in one line."""

from __future__ import annotations

from pathlib import Path

import mlflow
import polars as pl
import pytest
from engine_fixtures import ML1M_SCORE, assert_same_rankings, ml1m_prepared, raw_histories
from serving_fixtures import read_rankings, score_config, tiny_model, vocabulary

from pipelines.cli import main
from recsys_alibi.config import DataConfig, GenerateConfig, TrackingConfig
from recsys_alibi.data import schema
from recsys_alibi.data.ingest import DataError
from recsys_alibi.data.prepare import prepare
from recsys_alibi.data.synthetic import generate_events
from recsys_alibi.tracking import log_ranker, setup_tracking
from serving.pyfunc import RankerPyfunc, pyfunc_flavour
from serving.engines import run_score
from serving.score import score_with_model

NAME = "recsys-alibi-ranker"
CHAMPION = f"models:/{NAME}@champion"


def _register(model, items: pl.DataFrame, workdir: Path) -> None:
    """Log and register ``model`` as train does (both flavours) and give it the champion alias."""
    setup_tracking(TrackingConfig())
    with mlflow.start_run():
        logged = log_ranker(model, items, NAME, workdir, pyfunc=pyfunc_flavour(model, items, k=10))
    mlflow.MlflowClient().set_registered_model_alias(NAME, "champion", logged.version)


def _default_prepared(tmp_path: Path) -> Path:
    """The embedded default data (synthetic generator), small: 60 users, 40 items, prepared."""
    events = generate_events(GenerateConfig(users=60, items=40, min_events=5, max_events=60), seed=3)
    events.write_parquet(tmp_path / "events.parquet")
    prepare(DataConfig(min_events_per_user=2, min_events_per_item=1), tmp_path / "events.parquet", tmp_path / "prep")
    return tmp_path / "prep"


def test_pyfunc_of_the_registered_champion_equals_score_on_default_data(tmp_path, mlflow_store, one_torch_thread):
    prepared = _default_prepared(tmp_path)
    items = pl.read_parquet(prepared / schema.ITEMS_FILE)
    _register(tiny_model(n_items=items.height, seed=4), items, tmp_path / "w")
    pyfunc = mlflow.pyfunc.load_model(CHAMPION)
    assert set(pyfunc.metadata.flavors) == {"pytorch", "python_function"}
    assert pyfunc.metadata.get_input_schema() is None  # MLflow would refuse Polars and Arrow input; checked here
    assert {p.name: p.default for p in pyfunc.metadata.get_params_schema().params} == {"k": 10, "exclude_seen": True}
    assert pyfunc.metadata.saved_input_example_info is not None  # the input example is logged
    for exclude_seen in (True, False):
        config = score_config(k=7, exclude_seen=exclude_seen, shard_users=25)
        out = tmp_path / f"score-{exclude_seen}"
        run_score(config, CHAMPION, prepared, out, progress=False)
        got = pyfunc.predict(raw_histories(prepared).to_pandas(), params={"k": 7, "exclude_seen": exclude_seen})
        assert_same_rankings(pl.from_pandas(got), read_rankings(out))


def test_pyfunc_unknown_items_and_empty_histories_follow_score(prepared, tmp_path):
    """Raw events with items the model never saw: score drops their events, so does the pyfunc."""
    frame = raw_histories(prepared)
    unknown = frame.with_columns(  # two unknown ids in every history, one user with only unknown ids
        pl.concat_list(pl.lit(pl.Series([[99_001]])), schema.ITEM_ID, pl.lit(pl.Series([[99_002]]))).alias(schema.ITEM_ID)
    ).with_columns(
        pl.when(pl.col(schema.USER_ID) == "u005").then(pl.lit(pl.Series([[99_003, 99_004]]))).otherwise(pl.col(schema.ITEM_ID))
        .alias(schema.ITEM_ID)
    )  # fmt: skip
    events = unknown.with_columns(pl.int_ranges(0, pl.col(schema.ITEM_ID).list.len()).alias(schema.TIMESTAMP))
    events.explode(schema.ITEM_ID, schema.TIMESTAMP).write_csv(tmp_path / "events.csv")
    result = score_with_model(score_config(), tiny_model(), vocabulary(), tmp_path / "events.csv", tmp_path / "out",
                              progress=False)  # fmt: skip
    assert result.skipped_users == 1 and result.unknown_items == 4
    empty = pl.DataFrame({schema.USER_ID: ["nobody"], schema.ITEM_ID: [[]]}, schema_overrides={schema.ITEM_ID: pl.List(pl.Int64)})
    got = RankerPyfunc(tiny_model(), vocabulary(), score_config().score).predict_polars(pl.concat([unknown, empty]), {"k": 10})
    assert_same_rankings(got, read_rankings(tmp_path / "out"))
    assert "u005" not in got.get_column(schema.USER_ID).to_list() and "nobody" not in got.get_column(schema.USER_ID)


def test_pyfunc_batch_of_only_empty_histories_gives_empty_rankings():
    """A batch (a Spark partition) whose every history is empty, or left empty once the events of
    pre-epoch time are dropped: no rows, as for one such user beside others (was a DataError naming
    the pyfunc's temporary directory as 'another catalog')."""
    empty = pl.DataFrame({schema.USER_ID: ["a", "b"], schema.ITEM_ID: [[], []]},
                         schema_overrides={schema.ITEM_ID: pl.List(pl.Int64)})  # fmt: skip
    got = RankerPyfunc(tiny_model(), vocabulary(), score_config().score).predict_polars(empty, {"k": 10})
    assert got.height == 0 and got.columns == [schema.USER_ID, schema.RANK, schema.ITEM_ID, schema.SCORE]
    item = vocabulary().get_column(schema.ITEM_ID)[0]
    dropped = pl.DataFrame({schema.USER_ID: ["a"], schema.ITEM_ID: [[item]], schema.TIMESTAMP: [[-5]]})
    model = tiny_model(time_gap_buckets=6)
    assert RankerPyfunc(model, vocabulary(), score_config().score).predict_polars(dropped, {"k": 10}).height == 0


def test_pyfunc_time_gap_model_reads_timestamps_like_score(prepared, tmp_path):
    model = tiny_model(time_gap_buckets=6)
    score_with_model(score_config(), model, vocabulary(), prepared, tmp_path / "out", progress=False)
    got = RankerPyfunc(model, vocabulary(), score_config().score).predict_polars(raw_histories(prepared, with_time=True))
    assert_same_rankings(got, read_rankings(tmp_path / "out"))
    frame = raw_histories(prepared, with_time=True)
    shifted = frame.with_columns(pl.col(schema.TIMESTAMP).list.eval(pl.element() * 1000))  # other gaps, other rankings
    other = RankerPyfunc(model, vocabulary(), score_config().score).predict_polars(shifted)
    assert not other.get_column(schema.SCORE).equals(got.get_column(schema.SCORE))


def test_pyfunc_equals_score_on_ml1m(shared_data, tmp_path):
    prepared = ml1m_prepared(shared_data, tmp_path / "prep")
    model, items = tiny_model(n_items=3_416, seed=5), pl.read_parquet(prepared / schema.ITEMS_FILE)
    config = score_config(**ML1M_SCORE)
    score_with_model(config, model, items, prepared, tmp_path / "out", progress=False)
    got = RankerPyfunc(model, items, config.score).predict(raw_histories(prepared).to_pandas(), params={"k": 10})
    expected = read_rankings(tmp_path / "out")
    assert expected.get_column(schema.USER_ID).n_unique() == 6_040 and expected.height == 60_400
    assert_same_rankings(pl.from_pandas(got), expected)


def test_pyfunc_reads_millisecond_and_negative_times_as_score_does_for_a_time_gap_model(prepared, tmp_path):
    """Times in ms (prepare's rule: integers above 1e11 are ms) and a pre-epoch event: the pyfunc
    reads and drops them as score reads the same events (dropped there as bad_timestamp rejects)."""
    import numpy as np

    rng = np.random.default_rng(7)
    frame = raw_histories(prepared)
    steps = [rng.integers(1_000, 5_000_000, len(h)) for h in frame.get_column(schema.ITEM_ID).to_list()]  # ms
    millis = pl.Series(schema.TIMESTAMP, [(1_700_000_000_000 + np.cumsum(s)).tolist() for s in steps])
    frame = frame.with_columns(millis)
    first = frame.get_column(schema.USER_ID)[3]  # an event before the epoch, first in this user's history
    frame = frame.with_columns(
        pl.when(pl.col(schema.USER_ID) == first).then(pl.concat_list(pl.lit(1005), schema.ITEM_ID)).otherwise(pl.col(schema.ITEM_ID))
        .alias(schema.ITEM_ID),
        pl.when(pl.col(schema.USER_ID) == first).then(pl.concat_list(pl.lit(-86_400_000), schema.TIMESTAMP))
        .otherwise(pl.col(schema.TIMESTAMP)).alias(schema.TIMESTAMP),
    )  # fmt: skip
    frame.explode(schema.ITEM_ID, schema.TIMESTAMP).write_csv(tmp_path / "events.csv")
    model = tiny_model(time_gap_buckets=12)
    result = score_with_model(score_config(), model, vocabulary(), tmp_path / "events.csv", tmp_path / "out", progress=False)
    assert result.rejected_rows == 1 and result.users == 23
    expected = read_rankings(tmp_path / "out")
    got = RankerPyfunc(model, vocabulary(), score_config().score).predict_polars(frame.to_pandas(), {"k": 10})
    assert_same_rankings(got, expected)
    as_seconds = frame.with_columns(pl.col(schema.TIMESTAMP).list.eval(pl.element() // 1000)).filter(pl.col(schema.USER_ID) != first)
    other = RankerPyfunc(model, vocabulary(), score_config().score).predict_polars(as_seconds)  # the same times in s
    assert_same_rankings(other, expected.filter(pl.col(schema.USER_ID) != first))


MALFORMED = [
    ({schema.USER_ID: ["a"]}, "item_id", "missing"),
    ({schema.ITEM_ID: [[1001]]}, "user_id", "missing"),
    ({schema.USER_ID: ["a"], schema.ITEM_ID: [1001]}, "item_id", "must be a list"),
    ({schema.USER_ID: ["a", "a"], schema.ITEM_ID: [[1001], [1002]]}, "user_id", "several rows"),
    ({schema.USER_ID: ["a", None], schema.ITEM_ID: [[1001], [1002]]}, "user_id", "null"),
    ({schema.USER_ID: [None, 2], schema.ITEM_ID: [[1001], [1002]]}, "user_id", "1 null id(s) (first: row 0)"),  # NaN
    ({schema.USER_ID: [1.5], schema.ITEM_ID: [[1001]]}, "user_id", "integers or strings"),
    ({schema.USER_ID: ["a", "b"], schema.ITEM_ID: [[1001], None]}, "item_id", "null list"),
    ({schema.USER_ID: ["a"], schema.ITEM_ID: [[1001, None]]}, "item_id", "null item ids"),
    ({schema.USER_ID: ["a"], schema.ITEM_ID: [[1001.0]]}, "item_id", "integers or strings"),
]


def test_pyfunc_rejects_malformed_input_with_one_line_naming_the_column(tmp_path, mlflow_store):
    import pandas as pd

    _register(tiny_model(), vocabulary(), tmp_path / "w")
    pyfunc = mlflow.pyfunc.load_model(CHAMPION)
    for columns, column, problem in MALFORMED:
        with pytest.raises(DataError) as err:
            pyfunc.predict(pd.DataFrame(columns), params={"k": 5})
        message = str(err.value)
        assert "\n" not in message and f"'{column}'" in message and problem in message, message
    with pytest.raises(DataError, match="'k'"):
        pyfunc.predict(pd.DataFrame({schema.USER_ID: ["a"], schema.ITEM_ID: [[1001]]}), params={"k": 0})
    timed = RankerPyfunc(tiny_model(time_gap_buckets=6), vocabulary())
    for frame, problem in [({schema.USER_ID: ["a"], schema.ITEM_ID: [[1001]]}, "missing"),
                           ({schema.USER_ID: ["a"], schema.ITEM_ID: [[1001, 1002]], schema.TIMESTAMP: [[5]]}, "length")]:  # fmt: skip
        with pytest.raises(DataError) as err:
            timed.predict(pd.DataFrame(frame))
        assert "\n" not in str(err.value) and "'timestamp'" in str(err.value) and problem in str(err.value)


def test_score_engine_ray_without_ray_is_a_one_line_error(prepared, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # import ray -> ImportError
    code = main(["score", "--engine", "ray", "--model-uri", "runs:/x/model", "--input", str(prepared),
                 "--output", str(tmp_path / "out")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: score.engine=ray needs Ray") and "ray.lock.txt" in err[-1]


def test_pyfunc_integer_ids_beyond_64_bits_are_one_line_and_narrow_ones_rank_as_int64(tmp_path):
    import numpy as np
    import pandas as pd

    pyfunc = RankerPyfunc(tiny_model(), vocabulary())
    for frame, column in [({schema.USER_ID: [2**70], schema.ITEM_ID: [[1001]]}, schema.USER_ID),
                          ({schema.USER_ID: [1], schema.ITEM_ID: [[1001, 2**64 + 1]]}, schema.ITEM_ID)]:  # fmt: skip
        with pytest.raises(DataError) as err:
            pyfunc.predict(pd.DataFrame(frame), params={"k": 3})
        assert "\n" not in str(err.value) and f"'{column}'" in str(err.value) and "64 bits" in str(err.value)
    wide = pyfunc.predict(pd.DataFrame({schema.USER_ID: [7, 8], schema.ITEM_ID: [[1001, 1002], [1003]]}),
                          params={"k": 3})  # fmt: skip
    narrow = pyfunc.predict(pd.DataFrame({schema.USER_ID: np.array([7, 8], dtype=np.uint8),
                                          schema.ITEM_ID: [np.array([1001, 1002], dtype=np.uint16),
                                                           np.array([1003], dtype=np.uint16)]}), params={"k": 3})  # fmt: skip
    assert narrow.dtypes.tolist() == wide.dtypes.tolist() and narrow.equals(wide) and len(wide) == 6


def _input_types(frame: pl.DataFrame) -> dict:
    """``frame`` as every input type the pyfunc's docstring lists (and an Arrow batch through ``to_pandas()``)."""
    import pyarrow as pa

    table = frame.to_arrow()
    batch = pa.RecordBatch.from_arrays([column.combine_chunks() for column in table.columns], schema=table.schema)
    return {"pandas": frame.to_pandas(), "polars": frame, "arrow table": table, "arrow batch": batch,
            "arrow batch to_pandas": batch.to_pandas(), "dict": frame.to_dict(as_series=False)}  # fmt: skip


def test_pyfunc_takes_every_listed_input_type_and_an_empty_batch_gives_empty_rankings(prepared, tmp_path, mlflow_store):
    """pandas, Polars, Arrow table and batch, dict: the same rankings; empty batches (an empty Spark
    partition, also through to_pandas() as in docs/scaling.md's mapInArrow recipe): 0 rows, the long schema."""
    import pyarrow as pa

    _register(tiny_model(), vocabulary(), tmp_path / "w")
    pyfunc = mlflow.pyfunc.load_model(CHAMPION)
    score_with_model(score_config(k=5), tiny_model(), vocabulary(), prepared, tmp_path / "out", progress=False)
    expected = read_rankings(tmp_path / "out")
    frame = raw_histories(prepared)
    for name, given in _input_types(frame).items():
        got = pyfunc.predict(given, params={"k": 5})
        assert_same_rankings(pl.from_pandas(got), expected), name
    columns = [schema.USER_ID, schema.RANK, schema.ITEM_ID, schema.SCORE]
    out_schema = pa.schema([(schema.USER_ID, pa.string()), (schema.RANK, pa.int32()), (schema.ITEM_ID, pa.int64()),
                            (schema.SCORE, pa.float32())])  # fmt: skip
    empties = {**_input_types(frame.head(0)),
               "pandas object columns": __import__("pandas").DataFrame({c: [] for c in frame.columns}, dtype=object)}
    for name, given in empties.items():
        got = pyfunc.predict(given, params={"k": 5})
        assert list(got.columns) == columns and len(got) == 0, name
        assert pa.RecordBatch.from_pandas(got, schema=out_schema, preserve_index=False).num_rows == 0  # the recipe


def test_pyfunc_users_without_rows_are_reported_with_the_reason_score_gives(tmp_path, mlflow_store, caplog):
    """break-api-s67 finding 14: a user whose history is [] was absent from the output with no word, while a
    None history's error told the caller to "give [] for a user without events". Such users still get no
    rows (the long format has none to give; score lists them in _skipped/), now logged and listed."""
    import logging

    import pandas as pd

    _register(tiny_model(), vocabulary(), tmp_path / "w")
    loaded = mlflow.pyfunc.load_model(CHAMPION)
    frame = pd.DataFrame({schema.USER_ID: ["a", "b", "c"], schema.ITEM_ID: [[1001, 1002, 1003], [], [99_001, 99_002]]})
    with caplog.at_level(logging.WARNING, logger="serving.pyfunc"):
        got = loaded.predict(frame, params={"k": 3})
    assert got[schema.USER_ID].tolist() == ["a"] * 3 and got[schema.RANK].tolist() == [1, 2, 3]
    warned = [r.getMessage() for r in caplog.records if "got no rows" in r.getMessage()]
    assert warned == ["pyfunc predict: 2 of 3 user(s) got no rows (no_events: 1, no_known_item: 1), as score lists "
                      "them in _skipped/; RankerPyfunc.predict_with_skipped returns them with the reason"]
    rankings, skipped = loaded.get_raw_model().predict_with_skipped(frame, {"k": 3})
    assert_same_rankings(rankings, pl.from_pandas(got))
    assert skipped.sort(schema.USER_ID).to_dicts() == [
        {schema.USER_ID: "b", "reason": "no_events", "input_events": 0},
        {schema.USER_ID: "c", "reason": "no_known_item", "input_events": 2},
    ]
    only_empty = pd.DataFrame({schema.USER_ID: [7, 8], schema.ITEM_ID: [[], []]})
    rankings, skipped = loaded.get_raw_model().predict_with_skipped(only_empty, {"k": 3})
    assert rankings.height == 0 and skipped.to_dicts() == [
        {schema.USER_ID: 7, "reason": "no_events", "input_events": 0},
        {schema.USER_ID: 8, "reason": "no_events", "input_events": 0},
    ]
    with pytest.raises(DataError, match=r"give \[\] for a user without events \(that user gets no rows: skipped as no_events\)"):
        loaded.predict(pd.DataFrame({schema.USER_ID: ["a", "b"], schema.ITEM_ID: [[1001], None]}), params={"k": 3})
