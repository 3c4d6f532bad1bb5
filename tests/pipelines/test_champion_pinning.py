"""break-config-s66 findings 1, 4, 8 and 11: the pipeline scores with the version its gate settled on, a
version registered before a gate that never decided is gated by the next run, a model of a deleted run is
refused through every registry URI (the gate's champion too), a champion that cannot load is refused before
any data work, and only a missing alias reads as "no champion"."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow.exceptions import MlflowException

from pipelines import pipeline as pipeline_module
from pipelines import promotion
from pipelines.cli import main
from recsys_alibi.config import TrackingConfig, load_config
from recsys_alibi.tracking import ModelUriError, load_ranker, log_ranker, setup_tracking

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))
from serving_fixtures import tiny_model, vocabulary  # noqa: E402
from test_pipeline_end_to_end import TINY  # noqa: E402
from test_preflight import _appended_setup, _files, _pipeline_args  # noqa: E402

NAME = "pin-test"


def _tiny_pipeline(out: Path, *extra: str) -> list[str]:
    args = ["pipeline", "--output", str(out), "--quiet"]
    for item in [*TINY, f"tracking.registered_model={NAME}", *extra]:
        args += ["--set", item]
    return args


def _champion(name: str = "recsys-alibi-ranker", tmp_path: Path | None = None) -> mlflow.entities.model_registry.ModelVersion:
    """A tiny ranker registered as version 1 of ``name`` and given the alias ``champion``."""
    setup_tracking(TrackingConfig())
    with mlflow.start_run():
        logged = log_ranker(tiny_model(), vocabulary(), name, tmp_path / "w")
    client = mlflow.MlflowClient()
    client.set_registered_model_alias(name, "champion", logged.version)
    return client.get_model_version(name, logged.version)


# --- finding 11: current_champion ------------------------------------------------------------------


def test_only_a_missing_alias_or_model_reads_as_no_champion(tmp_path, mlflow_store, monkeypatch):
    held = _champion(NAME, tmp_path)
    assert promotion.current_champion(NAME, "champion").version == held.version
    assert promotion.current_champion(NAME, "no-such-alias") is None  # INVALID_PARAMETER_VALUE "... not found."
    assert promotion.current_champion("no-such-model", "champion") is None  # RESOURCE_DOES_NOT_EXIST

    def store_down(self, name, alias):
        raise MlflowException("(sqlite3.OperationalError) database is locked", error_code="INTERNAL_ERROR")

    monkeypatch.setattr(mlflow.MlflowClient, "get_model_version_by_alias", store_down)
    with pytest.raises(promotion.ChampionLookupError) as caught:
        promotion.current_champion(NAME, "champion")
    assert str(caught.value) == (
        f"cannot read the champion models:/{NAME}@champion from the tracking store {mlflow_store} "
        "((sqlite3.OperationalError) database is locked); nothing was promoted: run again when the store answers"
    )
    assert isinstance(caught.value, ValueError)  # a one-line error with exit 2, never "no champion yet"


def test_a_store_error_on_the_champion_stops_the_pipeline_before_any_work(tmp_path, mlflow_store, monkeypatch, capsys):
    _champion(NAME, tmp_path)

    def store_down(self, name, alias):
        raise MlflowException("connection reset", error_code="INTERNAL_ERROR")

    monkeypatch.setattr(mlflow.MlflowClient, "get_model_version_by_alias", store_down)
    out = tmp_path / "job"
    capsys.readouterr()
    assert main(_tiny_pipeline(out)) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: cannot read the champion models:/{NAME}@champion from the tracking store {mlflow_store} "
                   "(connection reset); nothing was promoted: run again when the store answers")  # fmt: skip
    assert not (out / "prepared").exists()


# --- finding 8: a deleted run through models:/ ------------------------------------------------------


def test_a_model_of_a_deleted_run_is_refused_through_every_registry_uri(tmp_path, mlflow_store, capsys, one_torch_thread):
    held = _champion(NAME, tmp_path)
    assert load_ranker(f"models:/{NAME}@champion").run_id == held.run_id  # live: loads
    mlflow.MlflowClient().delete_run(held.run_id)
    deleted = (f"MLflow run {held.run_id} is deleted; restore it (`mlflow runs restore --run-id {held.run_id}`) "
               "or use another model")  # fmt: skip
    for uri in (f"models:/{NAME}/1", f"models:/{NAME}@champion", f"runs:/{held.run_id}/model"):
        with pytest.raises(ModelUriError) as caught:
            load_ranker(uri)
        assert str(caught.value) == f"model '{uri}': {deleted}"
    out, _, _ = _appended_setup(tmp_path)
    capsys.readouterr()
    assert main(["score", "--model-uri", f"models:/{NAME}@champion", "--input", str(out / "prepared"),
                 "--output", str(tmp_path / "r")]) == 2  # fmt: skip
    assert capsys.readouterr().err.strip() == f"error: model 'models:/{NAME}@champion': {deleted}"
    assert main(["evaluate", "--prepared", str(out / "prepared"), "--model-uri", f"models:/{NAME}/1",
                 "--output", str(tmp_path / "ev")]) == 2  # fmt: skip
    assert capsys.readouterr().err.strip() == f"error: model 'models:/{NAME}/1': {deleted}"


@pytest.mark.parametrize("init_from", [None, "champion", f"models:/{NAME}/1"])
def test_a_champion_whose_run_is_deleted_is_refused_before_the_day_is_appended(
    tmp_path, mlflow_store, capsys, init_from
):
    held = _champion(NAME, tmp_path)
    mlflow.MlflowClient().delete_run(held.run_id)
    out, day2, before = _appended_setup(tmp_path)
    extra = [f"tracking.registered_model={NAME}"] + ([f"train.init_from={init_from}"] if init_from else [])
    capsys.readouterr()
    assert main(_pipeline_args(out, day2, *extra)) == 2
    err = capsys.readouterr().err.strip()
    champion_line = (f"the champion (version 1 of '{NAME}', alias 'champion'): MLflow run {held.run_id} is deleted; "
                     f"restore it (`mlflow runs restore --run-id {held.run_id}`), point the alias 'champion' at another "
                     "version, or delete the alias (the next version is then promoted without a comparison), then run "
                     "again")  # fmt: skip
    if init_from == f"models:/{NAME}/1":  # the warm start's own check comes first, with the URI's line
        assert err == (f"error: train.init_from={init_from}: MLflow run {held.run_id} is deleted; restore it "
                       f"(`mlflow runs restore --run-id {held.run_id}`) or use another model")  # fmt: skip
    else:
        assert err == f"error: {champion_line}"
    assert _files(out / "prepared") == before


def test_the_gate_refuses_a_champion_whose_run_was_deleted_during_the_run(tmp_path, mlflow_store):
    import polars as pl

    from recsys_alibi.data import schema

    held = _champion(NAME, tmp_path)
    config = load_config(None, [f"tracking.registered_model={NAME}", "evaluate.ks=[1,5,10]"])
    with mlflow.start_run():
        new = log_ranker(tiny_model(seed=1), vocabulary(), NAME, tmp_path / "w2")
    mlflow.MlflowClient().delete_run(held.run_id)
    sequences = pl.DataFrame({
        schema.USER_ID: [0, 1], schema.ITEM_IDX: pl.Series([[1, 2, 3, 4], [2, 3, 4, 5]], dtype=pl.List(pl.Int32)),
        schema.TIMESTAMP: pl.Series([[0, 1, 2, 3]] * 2, dtype=pl.List(pl.Int64)), schema.LENGTH: pl.Series([4, 4], dtype=pl.Int32),
    })  # fmt: skip
    with pytest.raises(ModelUriError) as caught:
        promotion.run_gate(config, tiny_model(seed=1), new.version, vocabulary(), sequences)
    assert str(caught.value).startswith(f"the champion (version 1 of '{NAME}', alias 'champion'): MLflow run "
                                        f"{held.run_id} is deleted; restore it")  # fmt: skip
    client = mlflow.MlflowClient()
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "1"  # never replaced
    assert "promotion.decision" not in client.get_model_version(NAME, new.version).tags


# --- finding 4: a champion that cannot load, found in preflight --------------------------------------


def test_a_champion_whose_artifacts_are_gone_is_refused_before_the_day_is_appended(tmp_path, mlflow_store, capsys):
    from mlflow.artifacts import download_artifacts

    held = _champion(NAME, tmp_path)
    shutil.rmtree(download_artifacts(artifact_uri=held.source))  # a local store: the download is the stored folder
    out, day2, before = _appended_setup(tmp_path)
    capsys.readouterr()
    assert main(_pipeline_args(out, day2, f"tracking.registered_model={NAME}")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: the champion (version 1 of '{NAME}', alias 'champion') cannot be loaded: its "
                          f"artifacts are missing or unreadable at {held.source} (")  # fmt: skip
    assert err.endswith("; restore them, or point the alias 'champion' at a version that loads, then run again")
    assert "\n" not in err and _files(out / "prepared") == before


# --- finding 1: scoring with the gated version ---------------------------------------------------------


def test_the_pipeline_scores_with_the_version_its_gate_settled_on_when_the_alias_moves_before_scoring(
    tmp_path, mlflow_store, monkeypatch, capsys, one_torch_thread
):
    """Another pipeline moves the alias between this run's gate and its scoring: the rankings still come from the
    version this gate settled on (models:/NAME/1), and the manifest names its run."""
    real = pipeline_module.score_into_place
    asked: list[str] = []

    def alias_moved_then_scored(config, model_uri, *args, **kwargs):
        client = mlflow.MlflowClient()
        gated = client.get_model_version_by_alias(NAME, "champion")
        other_run = client.create_run(client.get_run(gated.run_id).info.experiment_id).info.run_id
        client.set_terminated(other_run)
        other = client.create_model_version(NAME, gated.source, run_id=other_run)  # "another pipeline's" version
        client.set_registered_model_alias(NAME, "champion", other.version)
        asked.append(model_uri)
        return real(config, model_uri, *args, **kwargs)

    monkeypatch.setattr(pipeline_module, "score_into_place", alias_moved_then_scored)
    out = tmp_path / "job"
    assert main(_tiny_pipeline(out)) == 0
    printed = capsys.readouterr().out
    run_id = next(line for line in printed.splitlines() if line.startswith("mlflow_run_id: ")).split(": ", 1)[1]
    assert asked == [f"models:/{NAME}/1"]
    manifest = json.loads((out / "rankings" / "_manifest.json").read_text())
    assert manifest["identity"]["run_id"] == run_id and manifest["identity"]["model_uri"] == f"models:/{NAME}/1"
    assert f"rankings: {out / 'rankings'} (from models:/{NAME}/1)" in printed
    last = printed.strip().splitlines()[-1]
    assert f"run {run_id}; version 1; " in last and last.endswith("vs champion (none) n/a; decision: promoted: no champion yet")
    assert str(mlflow.MlflowClient().get_model_version_by_alias(NAME, "champion").version) == "2"  # moved by "the other"


# --- finding 4: a version registered before a gate that never decided ----------------------------------


def test_a_version_whose_gate_never_decided_is_gated_by_the_next_run_instead_of_training_another(
    tmp_path, mlflow_store, monkeypatch, capsys, one_torch_thread
):
    out = tmp_path / "job"
    real_gate, real_train = pipeline_module.run_gate, pipeline_module.run_train
    client = mlflow.MlflowClient

    def killed_before_deciding(config, model, version, *args, **kwargs):
        tags = client().get_model_version(NAME, version).tags  # tagged at registration, before the gate
        assert tags["promotion.decision"] == "pending"
        raise RuntimeError("the machine went away")

    monkeypatch.setattr(pipeline_module, "run_gate", killed_before_deciding)
    assert main(_tiny_pipeline(out)) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: pipeline failed: RuntimeError: the machine went away"
    first = client().get_model_version(NAME, "1")
    assert first.tags["promotion.decision"] == "pending"
    assert first.tags["promotion.incomplete"] == (
        "the gate did not finish (RuntimeError: the machine went away); a pipeline run again with the same data and "
        "config gates this version instead of training another")  # fmt: skip
    assert first.tags["lineage.data.sha256"] and first.tags["lineage.config_sha256"]

    def never(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(pipeline_module, "run_gate", real_gate)
    monkeypatch.setattr(pipeline_module, "run_train", never)
    assert main(_tiny_pipeline(out, "train.resume=true")) == 0
    printed = capsys.readouterr().out
    assert (f"not trained again: version 1 (model runs:/{first.run_id}/model) was trained and registered by an "
            "earlier pipeline run on this data with this config, which stopped before its gate") in printed
    assert printed.strip().splitlines()[-1].endswith("decision: promoted: no champion yet")
    lineage = next(line for line in printed.splitlines() if line.startswith("lineage: "))
    assert lineage.endswith(f"; run {first.run_id} (an earlier pipeline's, gated now) trained on this data and config")
    versions = client().search_model_versions(f"name='{NAME}'")
    assert [str(v.version) for v in versions] == ["1"]  # no second version registered
    tags = client().get_model_version(NAME, "1").tags
    assert tags["promotion.decision"] == "promoted" and "promotion.incomplete" not in tags
    assert str(client().get_model_version_by_alias(NAME, "champion").version) == "1"
    assert json.loads((out / "rankings" / "_manifest.json").read_text())["identity"]["run_id"] == first.run_id

    # another config is not the same job: it trains and registers its own version
    monkeypatch.setattr(pipeline_module, "run_train", real_train)
    assert main(_tiny_pipeline(out, "train.lr=0.002")) == 0
    assert sorted(str(v.version) for v in client().search_model_versions(f"name='{NAME}'")) == ["1", "2"]
    assert client().get_model_version(NAME, "2").tags["promotion.decision"] in ("promoted", "rejected")
