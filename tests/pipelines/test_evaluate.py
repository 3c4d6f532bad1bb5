"""The evaluate job's messages: the summary shows the metrics that were evaluated; vocabulary mismatches say what differs."""

from __future__ import annotations

import polars as pl
import pytest

from pipelines.cli import main
from pipelines.evaluate import check_same_vocabulary, check_training_split, headline_metrics


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
    with pytest.raises(ValueError) as caught:
        check_same_vocabulary(model, data, "runs:/r/model", tmp_path)
    assert str(caught.value) == (
        f"model 'runs:/r/model' was trained on another item vocabulary than {tmp_path} (1 of the model's 4 ids are "
        "not in the data (e.g. 'd') and 1 of the data's 4 are new (e.g. 'e')): evaluate on the prepared data the "
        "model was trained on"
    )
    typed = pl.DataFrame({"item_idx": [1, 2], "item_id": [1, 2]})
    texts = pl.DataFrame({"item_idx": [1, 2], "item_id": ["1", "2"]})
    with pytest.raises(ValueError, match=r"\(ids are Int64 in the model and String in the data\)"):
        check_same_vocabulary(typed, texts, "runs:/r/model", tmp_path)


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


def test_evaluate_temporal_refuses_a_leave_one_out_model_with_one_line(tmp_path, monkeypatch, capsys):
    import mlflow
    import torch

    from pipelines.train import SPLIT_TAG
    from recsys_alibi.config import ModelConfig, TrackingConfig
    from recsys_alibi.data.prepare import read_items
    from recsys_alibi.model.transformer import AlibiRanker
    from recsys_alibi.tracking import log_ranker, setup_tracking

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    small = ["--set", "generate.min_events=5", "--set", "generate.max_events=12"]
    assert main(["generate", "--users", "30", "--items", "20", "--output", "events.parquet", *small]) == 0
    assert main(["prepare", "--input", "events.parquet", "--output", "prepared", "--set", "data.min_events_per_user=3",
                 "--set", "data.min_events_per_item=1"]) == 0  # fmt: skip
    items = read_items(tmp_path / "prepared")
    torch.manual_seed(0)
    model = AlibiRanker(ModelConfig(d_model=16, n_heads=2, n_layers=1, max_len=8), n_items=items.height).eval()
    setup_tracking(TrackingConfig())
    with mlflow.start_run() as run:
        mlflow.set_tag(SPLIT_TAG, "leave_one_out")
        log_ranker(model, items, None, tmp_path / "w")
    capsys.readouterr()
    args = ["evaluate", "--model-uri", f"runs:/{run.info.run_id}/model", "--prepared", "prepared", "--output", "r"]
    assert main([*args, "--set", "evaluate.protocol=temporal"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and "was trained on split leave_one_out" in err[0]
    assert not (tmp_path / "r" / "report.json").exists()
    assert main(args) == 0  # the protocol it was trained on
