"""The evaluate job's messages: the summary shows the metrics that were evaluated; vocabulary mismatches say what differs."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from pipelines.cli import main
from pipelines.evaluate import check_training_split, headline_metrics, in_model_indices


def test_headline_shows_only_evaluated_metrics_at_the_reports_k():
    metrics = {"HR@5": 0.25, "NDCG@5": 0.125, "HR@20": 0.4, "NDCG@20": 0.2, "HR@50": 0.5, "NDCG@50": 0.3, "MRR": 0.1}
    assert headline_metrics(metrics) == "HR@20 0.4000 NDCG@20 0.2000 MRR 0.1000"  # the middle K, as report.md
    assert headline_metrics({"HR@10": 0.5, "NDCG@10": 0.25, "HR@1": 0.1, "MRR": 0.2}) == "HR@10 0.5000 NDCG@10 0.2500 MRR 0.2000"
    assert headline_metrics({"MRR": 0.2}) == "MRR 0.2000"


def test_evaluate_summary_without_k_10_prints_no_nan(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    small = ["--set", "generate.min_events=5", "--set", "generate.max_events=12"]
    assert main(["generate", "--users", "30", "--items", "20", "--output", "events.parquet", *small]) == 0
    assert main(["prepare", "--input", "events.parquet", "--output", "prepared", "--set", "data.min_events_per_user=3",
                 "--set", "data.min_events_per_item=1"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["evaluate", "--baseline", "popularity", "--prepared", "prepared", "--output", "report",
                 "--set", "evaluate.ks=[5,20]"]) == 0  # fmt: skip
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "nan" not in last and "HR@20 " in last and "NDCG@20 " in last and "MRR " in last and "@10" not in last


def test_vocabulary_mismatch_says_how_many_ids_differ(tmp_path):
    model = pl.DataFrame({"item_idx": [1, 2, 3, 4], "item_id": ["a", "b", "c", "d"]})
    data = pl.DataFrame({"item_idx": [1, 2, 3, 4], "item_id": ["a", "b", "c", "e"]})
    sequences = pl.DataFrame({"item_idx": [[1, 2], [4]]}, schema={"item_idx": pl.List(pl.Int32)})
    with pytest.raises(ValueError) as caught:
        in_model_indices(model, data, sequences, "runs:/r/model", tmp_path)
    assert str(caught.value) == (
        f"model 'runs:/r/model' was trained on another item vocabulary than {tmp_path} (1 of the model's 4 ids are "
        "not in the data (e.g. 'd') and 1 of the data's 4 are new (e.g. 'e')): evaluate on the prepared data the "
        "model was trained on"
    )
    # the same raw ids, at other indices or read as another type: mapped by id, as `score` maps them
    moved = pl.DataFrame({"item_idx": [1, 2, 3, 4], "item_id": ["c", "a", "d", "b"]})
    mapped = in_model_indices(model, moved, sequences, "runs:/r/model", tmp_path)  # data 1=c 2=a 4=b -> model 3, 1, 2
    assert mapped.get_column("item_idx").to_list() == [[3, 1], [2]]
    typed = pl.DataFrame({"item_idx": [1, 2], "item_id": [1, 2]})
    texts = pl.DataFrame({"item_idx": [1, 2], "item_id": ["2", "1"]})
    two = pl.DataFrame({"item_idx": [[1, 2]]}, schema={"item_idx": pl.List(pl.Int32)})
    assert in_model_indices(typed, texts, two, "runs:/r/model", tmp_path).get_column("item_idx").to_list() == [[2, 1]]
    assert in_model_indices(model, model, sequences, "runs:/r/model", tmp_path) is sequences  # equal: unchanged


@pytest.mark.parametrize(
    ("trained", "protocol", "cutoff", "refused"),
    [
        ("leave_one_out", "leave_one_out", None, False),
        ("leave_one_out", "temporal", 1000, True),  # trained on items[:n-2]: most events after the cutoff
        ("temporal<1000", "temporal", 1000, False),
        ("temporal<900", "temporal", 1000, False),  # trained on less: nothing held out was seen
        ("temporal<1100", "temporal", 1000, True),  # events in [1000, 1100) are targets and were trained on
        ("temporal<0", "temporal", 0, False),
        ("temporal<1000", "leave_one_out", None, True),  # users ending before 1000: their last event was trained on
        (None, "temporal", 1000, False),  # a run from before the tag: nothing to compare
    ],
)
def test_a_model_trained_on_held_out_events_is_refused(trained, protocol, cutoff, refused):
    if not refused:
        check_training_split(trained, protocol, cutoff, "runs:/r/model")
        return
    with pytest.raises(ValueError) as caught:
        check_training_split(trained, protocol, cutoff, "runs:/r/model")
    assert f"was trained on split {trained}" in str(caught.value) and "\n" not in str(caught.value)


def _prepared(tmp_path, monkeypatch, new_store) -> Path:
    """A tiny generated log prepared into ``tmp_path/prepared``, the cwd and the MLflow store in ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path / "mlflow.db"))
    small = ["--set", "generate.min_events=5", "--set", "generate.max_events=12"]
    assert main(["generate", "--users", "30", "--items", "20", "--output", "events.parquet", *small]) == 0
    assert main(["prepare", "--input", "events.parquet", "--output", "prepared", "--set", "data.min_events_per_user=3",
                 "--set", "data.min_events_per_item=1"]) == 0  # fmt: skip
    return tmp_path / "prepared"


def _log_model(model, items: pl.DataFrame, tmp_path, split: str = "leave_one_out", data: str | None = None) -> str:
    """Log ``model`` with vocabulary ``items`` in a run tagged with training split ``split`` (and data fingerprint
    ``data``, when given); its run id."""
    import mlflow

    from pipelines.train import SPLIT_TAG
    from recsys_alibi.config import TrackingConfig
    from recsys_alibi.tracking import log_ranker, setup_tracking

    setup_tracking(TrackingConfig())
    with mlflow.start_run() as run:
        mlflow.set_tag(SPLIT_TAG, split)
        if data is not None:
            from pipelines.train import DATA_TAG

            mlflow.set_tag(DATA_TAG, data)
        log_ranker(model, items, None, tmp_path / run.info.run_id)
    return run.info.run_id


def _random_model(n_items: int):
    import torch

    from recsys_alibi.config import ModelConfig
    from recsys_alibi.model.transformer import AlibiRanker

    torch.manual_seed(0)
    return AlibiRanker(ModelConfig(d_model=16, n_heads=2, n_layers=1, max_len=8), n_items=n_items).eval()


def test_evaluate_temporal_refuses_a_leave_one_out_model_with_one_line(tmp_path, monkeypatch, capsys, new_store):
    from recsys_alibi.data.prepare import read_items

    items = read_items(_prepared(tmp_path, monkeypatch, new_store))
    run_id = _log_model(_random_model(items.height), items, tmp_path)
    capsys.readouterr()
    args = ["evaluate", "--model-uri", f"runs:/{run_id}/model", "--prepared", "prepared", "--output", "r"]
    assert main([*args, "--set", "evaluate.protocol=temporal"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and "was trained on split leave_one_out" in err[0]
    assert not (tmp_path / "r" / "report.json").exists()
    assert main(args) == 0  # the protocol it was trained on


def test_a_model_with_the_same_ids_at_other_indices_is_evaluated_by_raw_id(tmp_path, monkeypatch, new_store):
    """The same model with its item table and vocabulary renumbered scores every raw id the same: same metrics."""
    import json

    import torch

    from recsys_alibi.data.prepare import read_items

    items = read_items(_prepared(tmp_path, monkeypatch, new_store))
    model = _random_model(items.height)
    n = items.height
    new_index = torch.tensor([0, *range(n, 0, -1)])  # item_idx i -> n + 1 - i (0 stays padding)
    renumbered = _random_model(n)
    state = model.state_dict()
    (table,) = [name for name, value in state.items() if value.shape[:1] == (n + 1,)]  # the item table (N + 1, D)
    state[table] = torch.zeros_like(state[table]).index_copy(0, new_index, state[table])
    renumbered.load_state_dict(state)
    renumbered_items = items.with_columns((n + 1 - pl.col("item_idx")).cast(pl.Int32).alias("item_idx"))
    reports = []
    for logged, vocabulary in ((model, items), (renumbered, renumbered_items)):
        run_id = _log_model(logged, vocabulary, tmp_path)
        out = tmp_path / f"report-{run_id}"
        assert main(["evaluate", "--model-uri", f"runs:/{run_id}/model", "--prepared", "prepared",
                     "--output", str(out)]) == 0  # fmt: skip
        reports.append(json.loads((out / "report.json").read_text())["metrics"])
    assert reports[0]["NDCG@10"] > 0 and reports[0]["MRR"] > 0
    assert reports[1] == pytest.approx(reports[0], abs=1e-6)


def test_an_ad_hoc_evaluation_is_its_own_run_and_leaves_the_training_run_as_it_was(tmp_path, monkeypatch, capsys, new_store):
    import json

    import mlflow

    from pipelines.evaluate import EVALUATES_TAG
    from pipelines.train import DATA_TAG
    from recsys_alibi.data.prepare import read_items
    from recsys_alibi.data.prepared import data_sha256

    prepared = _prepared(tmp_path, monkeypatch, new_store)
    items = read_items(prepared)
    run_id = _log_model(_random_model(items.height), items, tmp_path)
    before = mlflow.get_run(run_id).data
    args = ["evaluate", "--model-uri", f"runs:/{run_id}/model", "--prepared", "prepared", "--output", "r"]
    assert main([*args, "--set", "evaluate.ks=[5,10]"]) == 0
    capsys.readouterr()
    assert main([*args, "--set", "evaluate.ks=[10,20]"]) == 0  # a second one: a second record, nothing replaced
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    after = mlflow.get_run(run_id).data
    assert after.metrics == before.metrics and after.tags == before.tags  # the training run is untouched
    assert mlflow.MlflowClient().list_artifacts(run_id, "evaluation") == []
    evaluations = mlflow.search_runs(filter_string=f"tags.`{EVALUATES_TAG}` = '{run_id}'", output_format="list",
                                     search_all_experiments=True, order_by=["attributes.start_time ASC"])  # fmt: skip
    assert len(evaluations) == 2
    last = evaluations[-1].data
    report = json.loads((tmp_path / "r" / "report.json").read_text())["metrics"]
    assert last.metrics["test/NDCG_at_20"] == pytest.approx(report["NDCG@20"])
    assert "test/NDCG_at_20" not in evaluations[0].data.metrics and evaluations[0].data.params["evaluate.ks"] == "[5, 10]"
    assert last.tags["recsys_alibi.model_uri"] == f"runs:/{run_id}/model" and last.tags[DATA_TAG] == data_sha256(prepared)
    assert last.tags["recsys_alibi.eval_split"] == "leave_one_out"
    assert [a.path for a in mlflow.MlflowClient().list_artifacts(evaluations[-1].info.run_id, "evaluation")]
    assert printed.endswith(f"; MLflow run {evaluations[-1].info.run_id}")


def test_temporal_protocol_on_data_timed_by_line_order_is_refused_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    lines = [f"{u} {(u + t) % 12 + 1}" for u in range(1, 31) for t in range(6)]  # SASRec: user item, time = line order
    (tmp_path / "sas.txt").write_text("\n".join(lines) + "\n")
    assert main(["prepare", "--input", "sas.txt", "--format", "sasrec", "--output", "prepared"]) == 0
    capsys.readouterr()
    temporal = ["--set", "evaluate.protocol=temporal"]
    pipeline = ["pipeline", "--output", "run", "--quiet", "--set", "data.input=sas.txt", "--set", "data.format=sasrec"]
    for args in (["evaluate", "--baseline", "popularity", "--prepared", "prepared", "--output", "r"],
                 ["train", "--prepared", "prepared", "--quiet", "--set", "output=job"], pipeline):  # fmt: skip
        assert main([*args, *temporal]) == 2
        err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("error")]
        assert len(err) == 1 and err[0].startswith("error: evaluate.protocol=temporal needs real timestamps"), err
        assert "line order" in err[0] and "leave_one_out" in err[0]
    assert not (tmp_path / "r").exists() and not (tmp_path / "job").exists()
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before training
    assert main(["evaluate", "--baseline", "popularity", "--prepared", "prepared", "--output", "r"]) == 0


def test_evaluate_reads_one_prepare_and_refuses_a_directory_prepared_again_meanwhile(tmp_path, monkeypatch, capsys, new_store):
    import pipelines.evaluate as evaluate_job
    from recsys_alibi.config import DataConfig
    from recsys_alibi.data.prepare import prepare

    prepared = _prepared(tmp_path, monkeypatch, new_store)
    other = tmp_path / "other.csv"
    other.write_text("user_id,item_id,timestamp\n" + "\n".join(f"v{u},z{(u + t) % 7},{t}" for u in range(9) for t in range(5)))
    real_read = evaluate_job.read_sequences

    def read_then_prepare_again(*args, **kwargs):
        frame = real_read(*args, **kwargs)
        prepare(DataConfig(min_events_per_user=1, min_events_per_item=1, overwrite=True), other, prepared)  # another catalog
        return frame

    monkeypatch.setattr(evaluate_job, "read_sequences", read_then_prepare_again)
    capsys.readouterr()
    assert main(["evaluate", "--baseline", "popularity", "--prepared", "prepared", "--output", "r"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert err == [f"error: {prepared.name} was prepared again while this job was reading it; run the job again"]
    assert not (tmp_path / "r" / "report.json").exists()


def test_the_report_names_its_targets_and_the_temporal_cutoff(tmp_path, monkeypatch, capsys, new_store):
    """report.json's ``split``: the target events (one a user under leave-one-out; every event at or after the
    cutoff of a user with history before it under temporal) and the resolved cutoff, counted here by hand."""
    from recsys_alibi.data.prepare import read_sequences

    prepared = _prepared(tmp_path, monkeypatch, new_store)
    sequences = read_sequences(prepared)
    stamps = sorted(t for ts in sequences["timestamp"].to_list() for t in ts)
    cutoff = stamps[len(stamps) * 3 // 4]
    assert main(["evaluate", "--baseline", "popularity", "--prepared", "prepared", "--output", "loo"]) == 0
    loo = json.loads((tmp_path / "loo" / "report.json").read_text())
    assert loo["split"] == {"targets": loo["n_users"]} and loo["n_users"] == sequences.height
    assert main(["evaluate", "--baseline", "popularity", "--prepared", "prepared", "--output", "tmp", "--set",
                 "evaluate.protocol=temporal", "--set", f"evaluate.temporal_cutoff={cutoff}"]) == 0  # fmt: skip
    report = json.loads((tmp_path / "tmp" / "report.json").read_text())
    kept = [ts for ts in sequences["timestamp"].to_list() if ts[0] < cutoff <= ts[-1]]
    assert report["split"] == {"targets": sum(sum(t >= cutoff for t in ts) for ts in kept), "temporal_cutoff": cutoff}
    assert report["n_users"] == len(kept) > 0
    import datetime as dt

    when = dt.datetime.fromtimestamp(cutoff, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f"temporal cutoff: {cutoff} ({when})" in (tmp_path / "tmp" / "report.md").read_text()


def test_a_model_trained_on_other_data_is_evaluated_with_a_warning_and_a_report_note(tmp_path, monkeypatch, capsys,
                                                                                     new_store, caplog):
    """A model trained on another prepare of the log (a stricter k-core, an older snapshot) was scored on targets it
    may have trained on without a word: the run's data fingerprint is now compared with the directory's."""
    from recsys_alibi.data.prepare import read_items
    from recsys_alibi.data.prepared import data_sha256

    prepared = _prepared(tmp_path, monkeypatch, new_store)
    items = read_items(prepared)
    here = data_sha256(prepared)
    notes = {}
    for name, data in (("same", here), ("other", "f" * 64)):
        run_id = _log_model(_random_model(items.height), items, tmp_path, data=data)
        caplog.clear()
        assert main(["evaluate", "--model-uri", f"runs:/{run_id}/model", "--prepared", "prepared", "--output", name]) == 0
        notes[name] = (tmp_path / name / "report.md").read_text().split("## Notes")[1].splitlines()
        warned = [r.getMessage() for r in caplog.records if "trained on other prepared data" in r.getMessage()]
        assert len(warned) == (name == "other")
    other = [n for n in notes["other"] if "trained on other prepared data" in n]
    assert len(other) == 1 and f"data sha256 ffffffffffff, this directory's {here[:12]}" in other[0]
    assert not [n for n in notes["same"] if "other prepared data" in n]


def test_users_without_a_held_out_event_are_named_in_the_notes():
    """Leave-one-out drops a one-event history before the evaluator sees it: n_users shrank without a word."""
    from pipelines.evaluate import test_examples, unevaluated_notes
    from recsys_alibi.config import JobConfig

    sequences = pl.DataFrame({"user_id": [1, 2, 3], "item_idx": [[5], [1, 2, 3], [4, 5]], "length": [1, 3, 2]},
                             schema={"user_id": pl.Int64, "item_idx": pl.List(pl.Int32), "length": pl.Int32})  # fmt: skip
    config = JobConfig()
    examples = test_examples(config, sequences)
    assert examples["user_id"].to_list() == [2, 3]
    assert unevaluated_notes(config, sequences, examples) == (
        "1 of the 3 users of the prepared data are not evaluated (fewer than 2 events: nothing to hold out)",)
    assert unevaluated_notes(config, sequences.filter(pl.col("length") > 1), examples) == ()
