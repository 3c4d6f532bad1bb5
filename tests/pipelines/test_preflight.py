"""Issue 41, defects 9 and 16: the daily pipeline refuses what needs no data before it appends a day,
a deleted MLflow run is never loaded, and loading a model prints no download bars."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import mlflow
import pytest

from pipelines.cli import main
from recsys_alibi.config import ConfigError, DataConfig, JobConfig, TrackingConfig, load_config, with_overrides
from recsys_alibi.data.prepare import prepare
from recsys_alibi.tracking import ModelUriError, load_ranker, log_ranker, setup_tracking

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))
from serving_fixtures import tiny_model, vocabulary  # noqa: E402

SCHEDULE = ["train.init_from=champion", "train.max_epochs=8", "train.context_schedule=[[0, 4], [5, 8]]"]


def _day(path: Path, users: range) -> Path:
    path.write_text("user_id,item_id,timestamp\n" + "".join(f"u{u},i{(u + t) % 9},{t}\n" for u in users for t in range(6)))
    return path


def _appended_setup(tmp_path: Path) -> tuple[Path, Path, dict[str, bytes]]:
    """Day 1 prepared into ``out/prepared``; day 2 waiting; the prepared files' bytes."""
    out = tmp_path / "daily"
    day1, day2 = _day(tmp_path / "day1.csv", range(0, 12)), _day(tmp_path / "day2.csv", range(12, 20))
    prepare(DataConfig(min_events_per_user=1, min_events_per_item=1), day1, out / "prepared")
    return out, day2, _files(out / "prepared")


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _pipeline_args(out: Path, day: Path, *extra: str) -> list[str]:
    args = ["pipeline", "--output", str(out), "--quiet"]
    for item in ["generate.enabled=false", f"data.input={day}", "data.append=true", "data.min_events_per_user=1",
                 "data.min_events_per_item=1", *extra]:  # fmt: skip
        args += ["--set", item]
    return args


def test_a_warm_schedule_refused_in_the_daily_pipeline_leaves_the_day_unappended(tmp_path, mlflow_store, capsys):
    out, day2, before = _appended_setup(tmp_path)
    assert main(_pipeline_args(out, day2, *SCHEDULE)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: invalid config at 'train.warm.max_epochs': a warm start (train.init_from=champion) "
                          "trains 2 epochs (train.warm.max_epochs is unset: a quarter of train.max_epochs=8")  # fmt: skip
    assert "\n" not in err and _files(out / "prepared") == before  # the day was not appended


def test_run_pipeline_checks_what_needs_no_data_before_preparing(tmp_path, mlflow_store):
    from pipelines.pipeline import run_pipeline

    out, day2, before = _appended_setup(tmp_path)
    settings = {"init_from": "champion", "max_epochs": 8, "context_schedule": [[0, 4], [5, 8]]}
    config = with_overrides(JobConfig(), train=settings, output=str(out),  # not through load_config
                            data={"input": str(day2), "append": True, "min_events_per_user": 1, "min_events_per_item": 1})  # fmt: skip
    with pytest.raises(ConfigError, match=r"'train.warm.max_epochs': .* switches at epoch 5"):
        run_pipeline(config, progress=False)
    assert _files(out / "prepared") == before


def test_new_item_slots_without_item_features_are_refused_before_appending(tmp_path, mlflow_store, capsys):
    out, day2, before = _appended_setup(tmp_path)
    assert main(_pipeline_args(out, day2, "score.new_item_slots=1", "model.item_features.enabled=false")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: score.new_item_slots=1 holds places for items the model never saw") and "\n" not in err
    assert _files(out / "prepared") == before


def _logged_run(tmp_path: Path) -> str:
    """A tiny ranker logged (not registered) in a run of the test store; returns the run id."""
    setup_tracking(TrackingConfig())
    with mlflow.start_run() as run:
        log_ranker(tiny_model(), vocabulary(), None, tmp_path / "w")
    return run.info.run_id


def test_a_deleted_run_is_refused_by_every_loader_and_by_the_pipeline_before_appending(
    tmp_path, mlflow_store, capsys, one_torch_thread
):
    run_id = _logged_run(tmp_path)
    uri = f"runs:/{run_id}/model"
    assert load_ranker(uri).items.height == 30  # live: loads
    mlflow.MlflowClient().delete_run(run_id)
    with pytest.raises(ModelUriError) as err:
        load_ranker(uri)
    deleted = f"MLflow run {run_id} is deleted; restore it (`mlflow runs restore --run-id {run_id}`) or use another model"
    assert str(err.value) == f"model '{uri}': {deleted}"
    out, day2, before = _appended_setup(tmp_path)
    capsys.readouterr()
    assert main(_pipeline_args(out, day2, f"train.init_from={uri}")) == 2
    assert capsys.readouterr().err.strip() == f"error: train.init_from={uri}: {deleted}"
    assert _files(out / "prepared") == before
    prepared = tmp_path / "daily" / "prepared"
    assert main(["score", "--model-uri", uri, "--input", str(prepared), "--output", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {err.value}" and not (tmp_path / "r").exists()


def test_an_init_from_that_names_no_model_is_refused_before_appending(tmp_path, mlflow_store, capsys):
    out, day2, before = _appended_setup(tmp_path)
    setup_tracking(TrackingConfig())
    assert main(_pipeline_args(out, day2, "train.init_from=models:/no-such-model/3")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: train.init_from=models:/no-such-model/3: no such model in the tracking store (")
    assert _files(out / "prepared") == before


def test_a_warm_start_across_item_features_is_refused_before_appending(tmp_path, mlflow_store, capsys, one_torch_thread):
    run_id = _logged_run(tmp_path)
    with mlflow.start_run(run_id=run_id):
        mlflow.log_param("model.item_features.enabled", True)  # as run_train logs a feature model's config
    out, day2, before = _appended_setup(tmp_path)
    capsys.readouterr()
    assert main(_pipeline_args(out, day2, f"train.init_from=runs:/{run_id}/model")) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: cannot warm-start from runs:/{run_id}/model: it reads item features and "
        "model.item_features.enabled=false now; set the same, or leave train.init_from unset"
    )
    assert _files(out / "prepared") == before  # the day was not appended


def test_loading_and_logging_a_model_print_no_download_bars(tmp_path, mlflow_store, capfd, monkeypatch,
                                                             one_torch_thread):  # fmt: skip
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)  # as in a job that is not the CLI
    run_id = _logged_run(tmp_path)
    load_ranker(f"runs:/{run_id}/model")
    assert "Downloading artifacts" not in capfd.readouterr().err
    import os

    assert "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR" not in os.environ  # the caller's environment is left as it was


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("sqlite:/mlflow.db", "is not a SQLite store MLflow reads: write sqlite:///RELATIVE/PATH.db or "
                              "sqlite:////ABSOLUTE/PATH.db (three or four slashes)"),
        ("sqlite:///", "is not a SQLite store MLflow reads"),
        ("./mlruns", "is a folder store, which MLflow keeps in maintenance mode and refuses"),
        ("file:///srv/mlruns", "is a folder store"),
        ("htp://localhost:5000", ": MLflow has no store for 'htp://'; use sqlite:///PATH.db, http(s)://HOST:PORT"),
        ("http://", "names no host: write http://HOST:PORT"),
        ("mysql+nosuchdriver://u@h/db", "is not a database URL SQLAlchemy reads"),
    ],
)
def test_a_tracking_uri_mlflow_cannot_use_is_one_line_before_the_day_is_appended(tmp_path, monkeypatch, capsys, uri,
                                                                               message):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    out, day2, before = _appended_setup(tmp_path)
    assert main(_pipeline_args(out, day2, f"tracking.uri={uri}")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: tracking URI '{uri}' (tracking.uri)") and message in err and "\n" not in err
    assert _files(out / "prepared") == before and not (tmp_path / "mlflow.db").exists()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the variable is checked as well, and named
    assert main(["train", "--prepared", str(out / "prepared"), "--set", "train.max_epochs=1"]) == 2
    assert capsys.readouterr().err.startswith(f"error: tracking URI '{uri}' (MLFLOW_TRACKING_URI)")


@contextlib.contextmanager
def _http_server(health_status: int):
    """A local HTTP server answering ``GET /health`` with ``health_status`` (an MLflow server answers 200)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(health_status if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):  # quiet
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_accepted_tracking_uris(monkeypatch):
    from recsys_alibi.tracking import check_tracking_uri

    with _http_server(200) as mlflow_like, _http_server(401) as gated:  # /health 200; a gateway wanting credentials
        monkeypatch.setenv("DATABRICKS_HOST", "https://example.cloud")
        for uri in ("sqlite:///mlflow.db", "sqlite:////srv/mlflow.db", mlflow_like, gated, "databricks",
                    "databricks://profile"):  # fmt: skip
            check_tracking_uri(uri)
    with pytest.raises(ConfigError, match="needs a database driver that is not installed"):
        check_tracking_uri("postgresql+psycopg2://u@h/db")  # psycopg2 is not in the locks


def test_a_tracking_server_nobody_answers_at_and_databricks_without_credentials_are_one_line(monkeypatch, tmp_path):
    # a dead server: 4 minutes of urllib3 retries, then a traceback; databricks: a traceback after the day's prepare
    from recsys_alibi.tracking import check_tracking_uri

    with pytest.raises(ConfigError) as info:
        check_tracking_uri("http://127.0.0.1:1")
    assert str(info.value) == ("tracking URI 'http://127.0.0.1:1' (tracking.uri): no tracking server answers at "
                               "127.0.0.1:1 (Connection refused); start it, or point tracking.uri / MLFLOW_TRACKING_URI "
                               "at one that runs")  # fmt: skip
    with _http_server(404) as other, pytest.raises(ConfigError) as info:  # it answers HTTP, but is no MLflow server
        check_tracking_uri(other)
    assert str(info.value) == (f"tracking URI '{other}' (tracking.uri): the server at 127.0.0.1:{other.rsplit(':', 1)[1]} "
                               "is no MLflow tracking server (GET /health answered 404); point tracking.uri / "
                               "MLFLOW_TRACKING_URI at one (mlflow server --host HOST --port PORT)")  # fmt: skip
    for key in [key for key in __import__("os").environ if key.startswith("DATABRICKS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.databrickscfg
    with pytest.raises(ConfigError, match=r"^tracking URI 'databricks' \(tracking.uri\) needs Databricks credentials "
                                          "and none are set: set DATABRICKS_HOST and DATABRICKS_TOKEN"):  # fmt: skip
        check_tracking_uri("databricks")


def test_a_warm_start_from_another_architecture_is_refused_before_appending(tmp_path, mlflow_store, capsys,
                                                                            one_torch_thread):  # fmt: skip
    from recsys_alibi.tracking import log_config

    run_id = _logged_run(tmp_path)
    with mlflow.start_run(run_id=run_id):  # as run_train logs the config of tiny_model (D 16, 2 heads, 1 layer)
        log_config(with_overrides(JobConfig(), model={"d_model": 16, "n_heads": 2, "n_layers": 1, "max_len": 8}))
    out, day2, before = _appended_setup(tmp_path)
    capsys.readouterr()
    args = _pipeline_args(out, day2, f"train.init_from=runs:/{run_id}/model", "model.n_heads=2", "model.n_layers=1")
    assert main([*args, "--set", "model.d_model=32"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: cannot warm-start from runs:/{run_id}/model: it is another model (model.d_model=16 (now 32)); set the "
        "same model.* values or leave train.init_from unset to train from scratch")
    assert _files(out / "prepared") == before  # the day was not appended
    from pipelines.preflight import check_warm_shape, parent_run

    same = load_config(None, [f"train.init_from=runs:/{run_id}/model", "model.d_model=16", "model.n_heads=2",
                              "model.n_layers=1", "model.max_len=50"])
    check_warm_shape(same, parent_run(same))  # the same shape: ALiBi has no position table, so max_len may change
    learned = with_overrides(same, model={"position": "learned"})
    with pytest.raises(Exception, match=r"it is another model \(.*model.max_len=8 \(now 50\)"):
        check_warm_shape(learned, parent_run(learned))  # a learned table's size: refused before the day (was after)
