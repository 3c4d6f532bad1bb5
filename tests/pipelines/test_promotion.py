"""The promotion gate on the embedded store: first version promotes, worse is rejected, margin holds.

Models are tiny untrained rankers logged and registered for real; their validation metric is
faked (a number carried by each model) so the expected decisions are known exactly.
"""

from __future__ import annotations

import math

import mlflow
import polars as pl
import pytest

from pipelines import promotion
from recsys_alibi.config import ModelConfig, load_config
from recsys_alibi.data import schema
from recsys_alibi.model.transformer import AlibiRanker
from recsys_alibi.tracking import log_ranker, setup_tracking

N_ITEMS = 12
NAME = "gate-test-ranker"


def _items(prefix: str = "i") -> pl.DataFrame:
    return pl.DataFrame(
        {
            schema.ITEM_IDX: pl.Series(range(1, N_ITEMS + 1), dtype=pl.Int32),
            schema.ITEM_ID: [f"{prefix}{k}" for k in range(1, N_ITEMS + 1)],
            "count": pl.Series([5] * N_ITEMS, dtype=pl.Int64),
        }
    )


def _sequences() -> pl.DataFrame:
    rows = [[(u + t) % N_ITEMS + 1 for t in range(6)] for u in range(8)]
    return pl.DataFrame(
        {
            schema.USER_ID: list(range(8)),
            schema.ITEM_IDX: pl.Series(rows, dtype=pl.List(pl.Int32)),
            schema.TIMESTAMP: pl.Series([list(range(6))] * 8, dtype=pl.List(pl.Int64)),
            schema.LENGTH: pl.Series([6] * 8, dtype=pl.Int32),
        }
    )


def _config(margin: float = 0.0):
    return load_config(None, [f"tracking.registered_model={NAME}", f"tracking.promotion_margin={margin}", "evaluate.ks=[1,5,10]"])


def _register(config, fake_ndcg: float, items: pl.DataFrame, tmp_path, **model_cfg) -> tuple[AlibiRanker, str]:
    """Log and register a tiny ranker whose faked validation NDCG@10 is ``fake_ndcg``."""
    model = AlibiRanker(ModelConfig(d_model=8, n_heads=2, n_layers=1, max_len=8, **model_cfg), n_items=items.height)
    model.fake_ndcg = fake_ndcg  # pickled with the model, so the loaded champion carries it too
    setup_tracking(config.tracking)
    with mlflow.start_run() as run:
        logged = log_ranker(model, items, NAME, tmp_path / "model" / run.info.run_id)
    return model, str(logged.version)


@pytest.fixture
def fake_metrics(monkeypatch):
    monkeypatch.setattr(promotion, "validation_metrics", lambda config, model, examples, n: {"NDCG@10": model.fake_ndcg})


def _champion_version() -> str:
    return str(mlflow.MlflowClient().get_model_version_by_alias(NAME, "champion").version)


def test_first_version_promotes_and_worse_one_is_rejected_with_its_metric(tmp_path, mlflow_store, fake_metrics):
    config, items, sequences = _config(), _items(), _sequences()
    first, v1 = _register(config, 0.30, items, tmp_path)
    gate = promotion.run_gate(config, first, v1, items, sequences)
    assert gate.decision.promote and gate.decision.reason == "no champion yet" and gate.champion_version is None
    assert _champion_version() == v1

    worse, v2 = _register(config, 0.20, items, tmp_path)
    gate = promotion.run_gate(config, worse, v2, items, sequences)
    assert not gate.decision.promote and gate.champion_version == v1 and gate.champion_value == pytest.approx(0.30)
    assert _champion_version() == v1
    tags = mlflow.MlflowClient().get_model_version(NAME, v2).tags
    assert tags["rejected"] == "NDCG@10 0.2000 does not beat champion 0.3000 by more than margin 0.0000"
    assert float(tags["valid.NDCG_at_10"]) == pytest.approx(0.20)
    assert tags["promotion.decision"] == "rejected" and tags["promotion.champion_version"] == v1
    assert "rejected" not in mlflow.MlflowClient().get_model_version(NAME, v1).tags
    assert "rejected (champion kept)" in gate.line() and "0.2000" in gate.line() and "0.3000" in gate.line()


def test_margin_is_respected(tmp_path, mlflow_store, fake_metrics):
    config, items, sequences = _config(margin=0.05), _items(), _sequences()
    model, v1 = _register(config, 0.30, items, tmp_path)
    promotion.run_gate(config, model, v1, items, sequences)
    slightly, v2 = _register(config, 0.33, items, tmp_path)
    assert not promotion.run_gate(config, slightly, v2, items, sequences).decision.promote
    clearly, v3 = _register(config, 0.36, items, tmp_path)
    gate = promotion.run_gate(config, clearly, v3, items, sequences)
    assert gate.decision.promote and _champion_version() == v3
    assert mlflow.MlflowClient().get_model_version(NAME, v3).tags["promotion.decision"] == "promoted"


def test_champion_with_another_vocabulary_is_not_compared_and_the_new_one_promotes(tmp_path, mlflow_store, fake_metrics):
    config, sequences = _config(), _sequences()
    old, v1 = _register(config, 0.90, _items("old"), tmp_path)
    promotion.run_gate(config, old, v1, _items("old"), sequences)
    new, v2 = _register(config, 0.10, _items("new"), tmp_path)
    gate = promotion.run_gate(config, new, v2, _items("new"), sequences)
    assert gate.decision.promote and "another item vocabulary" in gate.decision.reason
    assert gate.champion_value is None and _champion_version() == v2


def test_decide_ties_nan_and_margin():
    assert promotion.decide(0.5, None, 0.0, "NDCG@10").promote
    assert not promotion.decide(0.25, 0.25, 0.0, "NDCG@10").promote  # a tie keeps the champion
    assert not promotion.decide(math.nan, 0.1, 0.0, "NDCG@10").promote
    assert promotion.decide(0.2501, 0.25, 0.0, "NDCG@10").promote
    assert not promotion.decide(0.26, 0.25, 0.02, "NDCG@10").promote


def test_promotion_metric_is_checked_before_training():
    promotion.check_promotion_metric(_config())
    promotion.check_promotion_metric(load_config(None, ["tracking.promotion_metric=MRR"]))
    with pytest.raises(ValueError, match="tracking.promotion_metric=NDCG@50 is not evaluated"):
        promotion.check_promotion_metric(load_config(None, ["tracking.promotion_metric=NDCG@50", "evaluate.ks=[10]"]))
    with pytest.raises(ValueError, match="is not evaluated"):
        promotion.check_promotion_metric(load_config(None, ["tracking.promotion_metric=ndcg10"]))


def test_pipeline_with_a_bad_promotion_metric_stops_before_training(tmp_path, mlflow_store, capsys):
    from pipelines.cli import main

    assert main(["pipeline", "--output", str(tmp_path / "job"), "--set", "tracking.promotion_metric=NDCG@7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: tracking.promotion_metric=NDCG@7 is not evaluated")
    assert not (tmp_path / "job" / "prepared").exists()


def test_real_validation_metrics_of_an_untrained_model_are_in_range():
    model = AlibiRanker(ModelConfig(d_model=8, n_heads=2, n_layers=1, max_len=8), n_items=N_ITEMS)
    examples = promotion.validation_examples(_sequences())
    assert examples.height == 8 and examples.get_column("targets").list.len().to_list() == [1] * 8
    metrics = promotion.validation_metrics(_config(), model, examples, N_ITEMS)
    assert 0.0 <= metrics["NDCG@10"] <= 1.0 and "HR@10" in metrics


def test_lineage_hashes_and_same_lineage_lookup(tmp_path, mlflow_store):
    config = _config()
    assert promotion.config_sha256(config) == promotion.config_sha256(load_config(None, [
        f"tracking.registered_model={NAME}", "evaluate.ks=[1,5,10]", "output=elsewhere"]))
    assert promotion.config_sha256(config) == promotion.config_sha256(load_config(None, [  # --resume: the same run
        f"tracking.registered_model={NAME}", "evaluate.ks=[1,5,10]", "train.resume=true"]))
    assert promotion.config_sha256(config) != promotion.config_sha256(load_config(None, ["evaluate.ks=[1,5,10]", "seed=7"]))
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    _sequences().write_parquet(prepared / schema.SEQUENCES_FILE)
    _items().write_parquet(prepared / schema.ITEMS_FILE)
    tags = promotion.lineage_tags(config, prepared)
    assert tags["lineage.data.events"] == "48" and tags["lineage.data.users"] == "8" and tags["lineage.data.items"] == "12"
    assert tags["lineage.seed"] == "42" and tags["lineage.project_version"]
    assert len(tags["lineage.git_commit"]) == 40 or tags["lineage.git_commit"] == "unknown"

    setup_tracking(config.tracking)
    ids = []
    for _ in range(2):
        with mlflow.start_run() as run:
            ids.append(run.info.run_id)
        same = promotion.tag_lineage(run.info.run_id, tags)
    assert same == [ids[0]]
    assert mlflow.MlflowClient().get_run(ids[1]).data.tags["lineage.data.sha256"] == tags["lineage.data.sha256"]


def test_pipeline_failure_is_exit_code_1_with_one_error_line(monkeypatch, capsys):
    import pipelines.pipeline
    from pipelines.cli import main

    def crash(config, progress=True):
        raise RuntimeError("tracking server unreachable\nsecond line")

    monkeypatch.setattr(pipelines.pipeline, "run_pipeline", crash)
    assert main(["pipeline", "--quiet"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: pipeline failed: RuntimeError: tracking server unreachable"
    )


def test_time_gap_champion_on_data_without_timestamps_is_not_compared(tmp_path, mlflow_store, fake_metrics):
    config, items, sequences = _config(), _items(), _sequences()
    old, v1 = _register(config, 0.90, items, tmp_path, time_gap_buckets=8)
    promotion.run_gate(config, old, v1, items, sequences)
    new, v2 = _register(config, 0.10, items, tmp_path)
    gate = promotion.run_gate(config, new, v2, items, sequences, real_timestamps=False)
    assert gate.decision.promote and "reads time gaps" in gate.decision.reason
    assert gate.champion_value is None and _champion_version() == v2
    # with real timestamps a time-gap challenger is compared with the champion as usual (and kept out)
    newer, v3 = _register(config, 0.05, items, tmp_path, time_gap_buckets=8)
    assert not promotion.run_gate(config, newer, v3, items, sequences).decision.promote


@pytest.mark.parametrize(("new_value", "promoted"), [(0.25, True), (0.20, False)])
def test_champion_without_the_new_items_is_compared_and_misses_their_targets(
    tmp_path, mlflow_store, fake_metrics, new_value, promoted
):
    """An appended day brings items the champion does not know: it still ranks the data by raw id and
    every validation target it cannot recommend is its miss (was: "not comparable", always promoted)."""
    config = _config()
    old, v1 = _register(config, 0.30, _items(), tmp_path)
    promotion.run_gate(config, old, v1, _items(), _sequences())
    grown = pl.concat([_items(), pl.DataFrame({schema.ITEM_IDX: pl.Series([13, 14], dtype=pl.Int32),
                                               schema.ITEM_ID: ["n13", "n14"], "count": pl.Series([5, 5], dtype=pl.Int64)})])
    sequences = _sequences().with_columns(  # users 0 and 1: the validation target (second to last event) is new
        pl.when(pl.col(schema.USER_ID) < 2).then(pl.col(schema.ITEM_IDX).list.eval(
            pl.when(pl.int_range(pl.len()) == 4).then(pl.lit(13, pl.Int32)).otherwise(pl.element())))
        .otherwise(pl.col(schema.ITEM_IDX)).alias(schema.ITEM_IDX))  # fmt: skip
    new, v2 = _register(config, new_value, grown, tmp_path)
    gate = promotion.run_gate(config, new, v2, grown, sequences)
    assert gate.champion_value == pytest.approx(0.30 * 6 / 8)  # 2 of 8 examples are the champion's misses
    assert gate.decision.promote is promoted and "not comparable" not in gate.decision.reason
    assert _champion_version() == (v2 if promoted else v1)


def test_examples_in_another_vocabulary_drop_unknown_events_with_their_gaps():
    import numpy as np

    examples = pl.DataFrame({
        "user_id": ["a", "b", "c", "d"],
        "history": pl.Series([[1, 4, 2], [4, 4], [2, 3], []], dtype=pl.List(pl.Int32)),
        "targets": pl.Series([[3], [2], [4], [2]], dtype=pl.List(pl.Int32)),
        "history_time_gaps": pl.Series([[0, 5, 6], [0, 1], [0, 2], []], dtype=pl.List(pl.Int32)),
    })  # fmt: skip
    remap = np.array([0, 7, 8, 9, 0])  # data item 4 is unknown to the model
    kept, unservable = promotion.examples_in_vocabulary(examples, remap)
    assert unservable == 3  # b: no known history event; c: unknown target; d: empty history
    assert kept.to_dicts() == [{"user_id": "a", "history": [7, 8], "targets": [9], "history_time_gaps": [0, 6]}]
    assert kept.schema == examples.schema


def test_champion_with_the_same_raw_ids_at_other_indices_is_compared_and_a_worse_one_rejected(
    tmp_path, mlflow_store, fake_metrics
):
    config, sequences = _config(), _sequences()
    champion, v1 = _register(config, 0.30, _items(), tmp_path)
    promotion.run_gate(config, champion, v1, _items(), sequences)
    renumbered = _items().with_columns(pl.col(schema.ITEM_ID).reverse())  # same raw ids, other item_idx
    worse, v2 = _register(config, 0.10, renumbered, tmp_path)
    gate = promotion.run_gate(config, worse, v2, renumbered, sequences)
    assert not gate.decision.promote and gate.champion_value == pytest.approx(0.30)
    assert _champion_version() == v1


def test_overlapping_gates_leave_the_alias_on_the_better_model(tmp_path, mlflow_store, monkeypatch):
    """Two gates read the same old champion; the worse one finishes last and must not take the alias."""
    import threading

    config, items, sequences = _config(), _items(), _sequences()
    monkeypatch.setattr(promotion, "validation_metrics", lambda config, model, examples, n: {"NDCG@10": model.fake_ndcg})
    base, v1 = _register(config, 0.30, items, tmp_path)
    promotion.run_gate(config, base, v1, items, sequences)
    better, v2 = _register(config, 0.50, items, tmp_path)
    worse, v3 = _register(config, 0.40, items, tmp_path)

    worse_read_v1, better_done = threading.Event(), threading.Event()

    def metrics(config, model, examples, n):
        if model.fake_ndcg == 0.30 and threading.current_thread().name == "worse":
            worse_read_v1.set()  # the worse gate has read v1 as the champion and is evaluating it ...
            assert better_done.wait(timeout=120)  # ... slowly: the better gate runs to its end meanwhile
        return {"NDCG@10": model.fake_ndcg}

    monkeypatch.setattr(promotion, "validation_metrics", metrics)
    results, errors = {}, []

    def gate(label, model, version, after=None):
        try:
            if after is not None:
                assert after.wait(timeout=120)
            results[label] = promotion.run_gate(config, model, version, items, sequences)
        except BaseException as err:  # noqa: BLE001 - surfaced below
            errors.append(err)
        finally:
            if label == "better":
                better_done.set()

    threads = [threading.Thread(target=gate, args=("worse", worse, v3), name="worse"),
               threading.Thread(target=gate, args=("better", better, v2, worse_read_v1), name="better")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert results["better"].decision.promote and results["better"].champion_version == v1
    assert _champion_version() == v2
    late = results["worse"]
    assert not late.decision.promote and late.champion_version == v2 and late.champion_value == pytest.approx(0.50)
    assert late.decision.reason == "NDCG@10 0.4000 does not beat champion 0.5000 by more than margin 0.0000"
    tags = mlflow.MlflowClient().get_model_version(NAME, v3).tags
    assert tags["promotion.decision"] == "rejected" and tags["promotion.champion_version"] == v2


def test_champion_trained_on_another_split_is_not_compared_and_the_new_one_promotes(tmp_path, mlflow_store, fake_metrics):
    from pipelines.train import SPLIT_TAG

    temporal = load_config(None, [f"tracking.registered_model={NAME}", "evaluate.ks=[1,5,10]",
                                  "evaluate.protocol=temporal", "evaluate.temporal_cutoff=4"])  # fmt: skip
    items, sequences = _items(), _sequences()
    old, v1 = _register(temporal, 0.90, items, tmp_path)  # a leave-one-out champion: it trained on items[:4]
    client = mlflow.MlflowClient()  # after _register: it sets the tracking URI
    client.set_tag(client.get_model_version(NAME, v1).run_id, SPLIT_TAG, "leave_one_out")
    promotion.run_gate(temporal, old, v1, items, sequences)
    new, v2 = _register(temporal, 0.10, items, tmp_path)
    client.set_tag(client.get_model_version(NAME, v2).run_id, SPLIT_TAG, "temporal<4")
    gate = promotion.run_gate(temporal, new, v2, items, sequences)
    assert gate.decision.promote and gate.champion_value is None and _champion_version() == v2
    assert gate.decision.reason == (f"champion v{v1} was trained on split leave_one_out, which holds this gate's "
                                    "temporal validation targets: not comparable, new version promoted")  # fmt: skip
    # a champion trained on the same split is compared as usual
    worse, v3 = _register(temporal, 0.05, items, tmp_path)
    client.set_tag(client.get_model_version(NAME, v3).run_id, SPLIT_TAG, "temporal<4")
    assert not promotion.run_gate(temporal, worse, v3, items, sequences).decision.promote


def test_a_champion_whose_artifacts_are_gone_fails_the_pipeline_with_exit_1_naming_it(
    tmp_path, mlflow_store, fake_metrics, capsys, monkeypatch
):
    """docs/scheduling.md: a champion whose artifacts cannot be loaded is a failure (exit 1), not a user error."""
    import shutil

    from mlflow.artifacts import download_artifacts

    from pipelines import cli

    config, items, sequences = _config(), _items(), _sequences()
    champion, v1 = _register(config, 0.30, items, tmp_path)
    promotion.run_gate(config, champion, v1, items, sequences)
    source = mlflow.MlflowClient().get_model_version(NAME, v1).source
    shutil.rmtree(download_artifacts(artifact_uri=source))  # a local store: the download is the stored folder
    with pytest.raises(Exception):  # noqa: B017 - gone indeed
        download_artifacts(artifact_uri=source)
    new, v2 = _register(config, 0.40, items, tmp_path)
    with pytest.raises(promotion.ChampionUnavailable) as caught:
        promotion.run_gate(config, new, v2, items, sequences)
    message = str(caught.value)
    assert message.startswith(f"the champion (version {v1} of '{NAME}', alias 'champion') cannot be loaded: its "
                              "artifacts are missing")  # fmt: skip
    assert "runs:/RUN_ID" not in message and "\n" not in message
    assert _champion_version() == v1  # the alias did not move
    assert not isinstance(caught.value, cli._user_errors())  # so `pipeline` exits 1, as documented

    def gate_fails(*args, **kwargs):
        raise caught.value

    monkeypatch.setattr(cli, "COMMANDS", {**cli.COMMANDS, "pipeline": gate_fails})
    capsys.readouterr()
    assert cli.main(["pipeline", "--output", str(tmp_path / "job")]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: pipeline failed: ChampionUnavailable: {message}"


def test_a_champion_whose_ids_overlap_by_chance_is_not_compared(tmp_path, mlflow_store, fake_metrics):
    """Two catalogs whose ids coincide on a few items: most validation examples are unservable, beyond
    score.max_unknown_share, so the champion is not compared (scoring would refuse it the same way)."""
    config, sequences = _config(), _sequences()
    chance = _items("i").with_columns(  # knows i1 .. i6 of the data's 12 items, nothing else
        pl.when(pl.col(schema.ITEM_IDX) <= 6).then(pl.col(schema.ITEM_ID)).otherwise(pl.lit("x") + pl.col(schema.ITEM_ID)))
    old, v1 = _register(config, 0.90, chance, tmp_path)
    promotion.run_gate(config, old, v1, chance, sequences)
    new, v2 = _register(config, 0.10, _items(), tmp_path)
    gate = promotion.run_gate(config, new, v2, _items(), sequences)
    assert gate.decision.promote and gate.champion_value is None and _champion_version() == v2
    assert "more than score.max_unknown_share=0.5: not comparable, new version promoted" in gate.decision.reason
