"""Issue 41, defects 10-12: a refused run names only paths the user gave or will read, leaves nothing
behind but the rejects its message names, and every bad pyfunc param is one exception in one frame."""

from __future__ import annotations

import tempfile
from pathlib import Path

import mlflow
import polars as pl
import pytest
from mlflow.exceptions import MlflowException
from serving_fixtures import score_config, tiny_model, vocabulary

from pipelines.cli import main
from recsys_alibi.config import TrackingConfig, with_overrides
from recsys_alibi.data import schema
from recsys_alibi.data.ingest import DataError
from recsys_alibi.tracking import log_ranker, setup_tracking
from serving.export import export_model
from serving import pyfunc as pyfunc_module
from serving.pyfunc import RankerPyfunc, pyfunc_flavour
from serving.score import score_with_model

NAME = "recsys-alibi-ranker"


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_pyfunc_batch_of_only_unknown_items_names_the_predict_input_not_its_temporary_folder():
    frame = pl.DataFrame({schema.USER_ID: ["a", "b"], schema.ITEM_ID: [[99_001, 99_002], [99_003]]})
    with pytest.raises(DataError) as err:
        RankerPyfunc(tiny_model(), vocabulary(), score_config().score).predict_polars(frame, {"k": 5})
    message = str(err.value)
    assert message.startswith("none of the 3 items of the predict input is in the model's vocabulary (")
    assert tempfile.gettempdir() not in message and "recsys-alibi-pyfunc" not in message


@pytest.mark.parametrize("job", ["score", "export"])
def test_raw_events_refused_after_staging_name_the_user_s_file_and_keep_only_the_named_rejects(tmp_path, job):
    """Score stages raw events in <output>/_input, export in a hidden folder it removes: neither is
    named; a refusal for rejected rows keeps them at <output>/_input/rejects.parquet, as it says."""
    run = (lambda cfg, model, src, out: score_with_model(cfg, model, vocabulary(), src, out, progress=False)) \
        if job == "score" else (lambda cfg, model, src, out: export_model(cfg, model, vocabulary(), src, out))  # fmt: skip
    (tmp_path / "bad.csv").write_text("user_id,item_id,timestamp\n1,,5\n2,,6\n")
    with pytest.raises(DataError) as err:
        run(score_config(), tiny_model(), tmp_path / "bad.csv", tmp_path / "out1")
    rejects = tmp_path / "out1" / "_input" / "rejects.parquet"
    assert str(err.value) == (f"all 2 rows were rejected (missing_item_id: 2); see {rejects} and check --format and "
                              "data.columns")  # fmt: skip
    assert pl.read_parquet(rejects).get_column("reject_reason").to_list() == ["missing_item_id"] * 2
    assert _tree(tmp_path / "out1") == ["_input", "_input/rejects.parquet"]

    (tmp_path / "walks.txt").write_text("1 1001\n1 1002\n2 1003\n")  # SASRec lines: time is line order
    config = with_overrides(score_config(), data={"format": "sasrec"})
    with pytest.raises(DataError) as err:
        run(config, tiny_model(time_gap_buckets=4), tmp_path / "walks.txt", tmp_path / "out2")
    assert str(err.value).startswith(f"the model reads time gaps but the data in {tmp_path / 'walks.txt'} has no timestamps")
    assert not (tmp_path / "out2").exists() and _tree(tmp_path) == ["bad.csv", "out1", "out1/_input",
                                                                  "out1/_input/rejects.parquet", "walks.txt"]  # fmt: skip


def test_score_refusing_a_header_only_csv_leaves_no_output_folder(tmp_path):
    (tmp_path / "events.csv").write_text("user_id,item_id,timestamp\n")
    with pytest.raises(DataError, match="empty input"):
        score_with_model(score_config(), tiny_model(), vocabulary(), tmp_path / "events.csv", tmp_path / "out",
                         progress=False)  # fmt: skip
    assert _tree(tmp_path) == ["events.csv"]  # was: out/_input, empty


def test_a_refused_command_leaves_no_folder_it_created(tmp_path, mlflow_store, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("events.csv").write_text("user_id,item_id,timestamp\n")
    setup_tracking(TrackingConfig())
    with mlflow.start_run():
        model = tiny_model()
        log_ranker(model, vocabulary(), NAME, tmp_path / "w")
    ours = lambda: [p for p in _tree(tmp_path) if not p.startswith(("mlruns", "mlflow.db"))]  # noqa: E731 - the store may change
    before = ours()
    uri = f"models:/{NAME}/1"
    commands = [
        ["prepare", "--input", "events.csv", "--output", "a/b/prepared"],
        ["score", "--model-uri", uri, "--input", "events.csv", "--output", "c/d/rankings"],
        ["export", "--model-uri", uri, "--input", "events.csv", "--output", "e/f/export"],
        ["evaluate", "--prepared", "none", "--baseline", "popularity", "--output", "g/h/report"],
    ]
    for command in commands:
        assert main(command) == 2, command
        assert ours() == before, command
    assert capsys.readouterr().err.count("error: ") == len(commands)


def _registered_pyfunc(tmp_path: Path):
    setup_tracking(TrackingConfig())
    model, items = tiny_model(), vocabulary()
    with mlflow.start_run():
        logged = log_ranker(model, items, NAME, tmp_path / "w", pyfunc=pyfunc_flavour(model, items, k=10))
    return mlflow.pyfunc.load_model(f"models:/{NAME}/{logged.version}")


def test_every_bad_pyfunc_param_is_one_mlflow_exception_in_one_frame(tmp_path, mlflow_store, one_torch_thread):
    loaded = _registered_pyfunc(tmp_path)
    frame = pl.DataFrame({schema.USER_ID: ["a"], schema.ITEM_ID: [[1001, 1002]]}).to_pandas()
    assert len(loaded.predict(frame, params={"k": 3})) == 3
    bad = [("k", "10"), ("k", 2.5), ("k", True), ("k", 0), ("k", -1), ("exclude_seen", "yes"), ("exclude_seen", 1)]
    for name, value in bad:
        with pytest.raises(MlflowException) as err:  # MLflow's type check or the model's rule: the same class
            loaded.predict(frame, params={name: value})
        assert err.value.error_code == "INVALID_PARAMETER_VALUE", (name, value)
        assert str(err.value).startswith(f"Invalid parameters found: {{('{name}', "), (name, value)
    with pytest.raises(pyfunc_module.PyfuncParamError) as err:
        loaded.predict(frame, params={"k": 0})
    assert str(err.value) == "Invalid parameters found: {('k', 'must be an integer >= 1, got 0')}"
    assert isinstance(err.value, DataError)  # and the project's input error


def test_the_pyfunc_called_without_mlflow_checks_every_param_by_the_same_rule():
    pyfunc = RankerPyfunc(tiny_model(), vocabulary(), score_config().score)
    frame = pl.DataFrame({schema.USER_ID: ["a"], schema.ITEM_ID: [[1001, 1002]]})
    expected = {
        ("k", "10"): "must be an integer >= 1, got '10'",
        ("k", 2.5): "must be an integer >= 1, got 2.5",
        ("k", True): "must be an integer >= 1, got True",
        ("k", 0): "must be an integer >= 1, got 0",
        ("exclude_seen", "yes"): "must be true or false, got 'yes'",
        ("kk", 3): "unknown param; the params are k, exclude_seen",
    }
    for (name, value), problem in expected.items():
        with pytest.raises(pyfunc_module.PyfuncParamError) as err:
            pyfunc.predict_polars(frame, {name: value})
        assert str(err.value) == f"Invalid parameters found: {({(name, problem)})!r}"
        assert err.value.error_code == "INVALID_PARAMETER_VALUE"
