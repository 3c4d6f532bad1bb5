"""The whole job on a tiny synthetic log: generate -> prepare -> train -> evaluate -> score."""

from __future__ import annotations

import json
import logging

import polars as pl
import pytest

from pipelines.cli import main
from recsys_alibi.config import load_config
from recsys_alibi.data import schema

TINY = [
    "generate.enabled=true", "generate.users=60", "generate.items=40", "generate.min_events=8",
    "generate.max_events=60", "data.min_events_per_user=3", "data.min_events_per_item=1",
    "model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.max_len=16",
    "train.max_epochs=2", "train.batch_size=32", "train.warmup_steps=1",
    "evaluate.ks=[1,5,10]", "evaluate.context_lengths=[4,8,32]", "score.k=10", "score.shard_users=25",
]


def test_pipeline_command_runs_every_step_and_writes_contract_files(tmp_path, mlflow_store, capsys):
    out = tmp_path / "job"
    args = ["pipeline", "--output", str(out), "--quiet"]
    for item in TINY:
        args += ["--set", item]
    assert main(args) == 0
    captured = capsys.readouterr()
    printed = captured.out
    # MLflow's registry chatter (printed past logging levels) is kept out of what the command prints
    assert "registered model" not in captured.err.lower() and "Created version" not in captured.err
    run_line = next(line for line in printed.splitlines() if line.startswith("mlflow_run_id: "))
    run_id = run_line.split(": ", 1)[1]
    assert "NDCG@10" in printed and "popularity" in printed and "rankings:" in printed

    report = json.loads((out / "report" / "report.json").read_text())
    assert set(report) >= {"protocol", "n_users", "metrics", "by_context_length", "by_history_length"}
    assert report["protocol"] == "leave_one_out"
    assert {"HR@10", "NDCG@10", "MRR", "Recall@10", "Coverage@10"} <= set(report["metrics"])
    sequences = pl.read_parquet(out / "prepared" / schema.SEQUENCES_FILE)
    assert report["n_users"] == sequences.height

    rankings = pl.read_parquet(out / "rankings" / "*.parquet")
    assert rankings.columns == [schema.USER_ID, schema.RANK, schema.ITEM_ID, schema.SCORE]
    assert rankings.schema[schema.RANK] == pl.Int32 and rankings.schema[schema.SCORE] == pl.Float32
    n_items = pl.read_parquet(out / "prepared" / schema.ITEMS_FILE).height
    per_user = rankings.group_by(schema.USER_ID).agg(pl.len().alias("rows"), pl.col(schema.RANK).max().alias("top"))
    expected = sequences.select(
        schema.USER_ID, pl.min_horizontal(pl.lit(10), n_items - pl.col(schema.ITEM_IDX).list.n_unique()).alias("want")
    )
    joined = expected.join(per_user, on=schema.USER_ID, how="left")
    assert joined.filter(pl.col("rows") != pl.col("want")).height == 0
    assert rankings.select(pl.struct(schema.USER_ID, schema.RANK).is_duplicated().any()).item() is False
    # no ranked item was already seen by that user
    seen = sequences.explode(schema.ITEM_IDX).join(
        pl.read_parquet(out / "prepared" / schema.ITEMS_FILE).select(schema.ITEM_IDX, schema.ITEM_ID), on=schema.ITEM_IDX
    ).select(schema.USER_ID, schema.ITEM_ID)
    assert rankings.join(seen, on=[schema.USER_ID, schema.ITEM_ID], how="semi").height == 0

    import mlflow

    run = mlflow.MlflowClient().get_run(run_id)
    assert "best_val_ndcg_at_10" in run.data.metrics and "test/NDCG_at_10" in run.data.metrics
    assert run.data.params["model.position"] == "alibi"
    assert {"attn/l0_h0_entropy", "attn/l0_h1_zero_share"} <= set(run.data.metrics)  # attention health
    versions = mlflow.MlflowClient().search_model_versions(f"name='{load_config().tracking.registered_model}'")
    assert [v.run_id for v in versions] == [run_id]
    # the first pipeline run has no champion to beat: its version takes the alias and scores
    name = load_config().tracking.registered_model
    assert mlflow.MlflowClient().get_model_version_by_alias(name, "champion").run_id == run_id
    assert printed.strip().splitlines()[-1].endswith("decision: promoted: no champion yet")
    assert run.data.tags["lineage.data.users"] == str(sequences.height) and run.data.tags["lineage.seed"] == "42"


def _files(folder) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def test_a_run_that_fails_while_scoring_leaves_the_earlier_rankings_whole(tmp_path, mlflow_store, capsys, caplog, monkeypatch):
    """The rankings of a run replace the earlier run's as a whole: a run that fails (or is killed) while it scores
    leaves them as they were, and the next run removes what a killed one left beside them."""
    import serving.engines as replace_module
    from recsys_alibi.staging import held_temp, release

    out = tmp_path / "job"
    args = ["pipeline", "--output", str(out), "--quiet", *[a for item in TINY for a in ("--set", item)]]
    assert main(args) == 0
    before = _files(out / "rankings")
    assert "_manifest.json" in before and any(name.startswith("part-") for name in before)
    real, written = replace_module.run_score, []

    def fails_after_writing(config, model_uri, input_path, output_dir, k, progress, shown_dir):
        real(config, model_uri, input_path, output_dir, k=k, progress=progress, shown_dir=shown_dir)
        written.append(_files(output_dir))
        raise RuntimeError("the disk went away")

    monkeypatch.setattr(replace_module, "run_score", fails_after_writing)
    assert main([*args, "--set", "score.k=5"]) == 1  # other rankings: 5 rows a user
    assert "pipeline failed: RuntimeError: the disk went away" in capsys.readouterr().err
    assert written and written[0] != before and _files(out / "rankings") == before
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".rankings")) == []  # its staging is gone

    killed, fd = held_temp(out / "rankings", directory=True)  # what a run killed while it scored leaves
    (killed / "rankings").mkdir()
    release(fd)
    monkeypatch.setattr(replace_module, "run_score", real)
    assert main([*args, "--set", "score.k=5"]) == 0
    after = pl.read_parquet(out / "rankings" / "part-*.parquet")
    assert after.group_by(schema.USER_ID).len()["len"].max() == 5 and _files(out / "rankings") != before
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".rankings")) == []
    capsys.readouterr()

    # rules that leave no user an item: an error naming this run's list of users, kept beside the earlier rankings
    before = _files(out / "rankings")
    items = pl.read_parquet(out / "prepared" / schema.ITEMS_FILE).select(schema.ITEM_ID)
    items.write_parquet(tmp_path / "deny.parquet")
    assert main([*args, "--set", f"score.deny={tmp_path / 'deny.parquet'}"]) == 2
    err = capsys.readouterr().err
    unranked = out / "rankings.unranked"
    assert "no user was ranked" in err and str(unranked) in err and ".tmp" not in err
    assert _files(out / "rankings") == before and pl.read_parquet(unranked / "*.parquet").height > 0

    # users left without an item: the warning and the summary name the list where it ends up, not the staging
    sequences = pl.read_parquet(out / "prepared" / schema.SEQUENCES_FILE)
    users, seen = sequences.get_column(schema.USER_ID), set(sequences.get_column(schema.ITEM_IDX)[0].to_list())
    table = pl.read_parquet(out / "prepared" / schema.ITEMS_FILE).filter(~pl.col(schema.ITEM_IDX).is_in(list(seen)))
    allow = pl.DataFrame({schema.USER_ID: users[:1], schema.ITEM_ID: table.get_column(schema.ITEM_ID)[:1]})
    allow.write_parquet(tmp_path / "allow.parquet")  # the first user is allowed one item not seen, the others none
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert main([*args, "--set", f"score.allow={tmp_path / 'allow.parquet'}"]) == 0
    printed = capsys.readouterr().out
    skipped = pl.read_parquet(out / "rankings" / "_skipped" / "*.parquet").height
    ranked = pl.read_parquet(out / "rankings" / "part-*.parquet").get_column(schema.USER_ID).n_unique()
    assert ranked == 1 and skipped == users.len() - 1 and not unranked.exists()  # the failed run's list is gone
    assert f"ranked {ranked} of {users.len()} users; not ranked: {skipped} (listed in {out / 'rankings' / '_skipped'})" in printed
    warned = [r.getMessage() for r in caplog.records if "were not ranked" in r.getMessage()]
    assert len(warned) == 1 and warned[0].endswith(str(out / "rankings" / "_skipped"))


def test_bad_config_key_is_a_one_line_error(capsys):
    assert main(["train", "--set", "model.d_modle=8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: invalid config at 'model.d_modle'")


def test_unknown_model_uri_and_missing_prepared_dir_are_one_line_errors(tmp_path, mlflow_store, capsys):
    (tmp_path / "in").mkdir()  # not the working directory: the default output runs/default/rankings is below it
    assert main(["score", "--model-uri", "runs:/0123456789abcdef/model", "--input", str(tmp_path / "in")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot load model 'runs:/0123456789abcdef/model'")
    assert main(["evaluate", "--baseline", "popularity", "--prepared", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "recsys-alibi prepare" in err[0]


def test_pipeline_with_time_gaps_trains_evaluates_and_scores_with_them(tmp_path, mlflow_store, capsys):
    out = tmp_path / "job"
    args = ["pipeline", "--output", str(out), "--quiet"]
    for item in [*TINY, "model.time_gap_buckets=16"]:
        args += ["--set", item]
    assert main(args) == 0
    printed = capsys.readouterr().out
    model_uri = next(line for line in printed.splitlines() if line.startswith("model_uri: ")).split(": ", 1)[1]
    report = json.loads((out / "report" / "report.json").read_text())
    rankings = pl.read_parquet(out / "rankings" / "*.parquet")
    # every user is ranked but those who have consumed the whole catalog (K' = min(K, N - seen) = 0 rows)
    sequences = pl.read_parquet(out / "prepared" / "sequences.parquet")
    n_items = pl.read_parquet(out / "prepared" / "items.parquet").height
    with_unseen = sequences.filter(pl.col("item_idx").list.n_unique() < n_items)
    assert 0 < with_unseen.height <= report["n_users"]
    assert set(rankings.get_column(schema.USER_ID).unique().to_list()) == set(with_unseen.get_column("user_id").to_list())
    if with_unseen.height < sequences.height:  # the others are listed with the reason, not silently missing
        listed = pl.read_parquet(out / "rankings" / "_skipped" / "*.parquet")
        assert listed.get_column("reason").unique().to_list() == ["every_item_seen"]
        assert listed.height == sequences.height - with_unseen.height

    from recsys_alibi.tracking import load_ranker

    model = load_ranker(model_uri).model
    assert model.uses_time_gaps and model.items.time_gap_buckets == 16
    # the evaluate command reloads the model and rebuilds the gaps: the same test figures
    again = tmp_path / "again"
    cmd = ["evaluate", "--prepared", str(out / "prepared"), "--model-uri", model_uri, "--output", str(again)]
    assert main([*cmd, *(x for item in TINY for x in ("--set", item))]) == 0
    assert json.loads((again / "report.json").read_text())["metrics"] == report["metrics"]


def test_time_gaps_on_data_without_timestamps_is_a_one_line_error(tmp_path, mlflow_store, capsys):
    log = tmp_path / "log.txt"
    log.write_text("".join(f"{u} {i}\n" for u in range(1, 9) for i in range(1, 7)))  # SASRec: line order is time
    prepared = tmp_path / "prepared"
    assert main(["prepare", "--input", str(log), "--format", "sasrec", "--output", str(prepared), "--quiet"]) == 0
    assert main(["train", "--prepared", str(prepared), "--set", "model.time_gap_buckets=16", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no timestamps" in err[0] and "time_gap_buckets" in err[0]


def test_the_pipeline_evaluates_on_the_prepare_its_model_was_trained_on(tmp_path, mlflow_store, capsys, monkeypatch):
    """A prepare that completes into OUTPUT/prepared/ after training: the evaluation and the gate refuse, one line."""
    import pipelines.pipeline as pipeline_job
    from pipelines.train import TrainJobResult
    from recsys_alibi.data.prepared import check_prepared
    from recsys_alibi.data.prepare import prepare

    out = tmp_path / "job"
    other = tmp_path / "other.csv"
    other.write_text("user_id,item_id,timestamp\n" + "\n".join(f"v{u},z{(u + t) % 7},{t}" for u in range(9) for t in range(5)))

    def trained_then_prepared_again(config, prepared_dir, **kwargs):
        trained_on = check_prepared(prepared_dir)
        prepare(config.data, other, prepared_dir)  # e.g. an overlapping job with the same --output
        return TrainJobResult(run_id="r", model=None, best_val_ndcg_at_10=0.0, epochs=1, train_seconds=0.0,
                              checkpoint="", prepare_id=trained_on)  # fmt: skip

    monkeypatch.setattr(pipeline_job, "run_train", trained_then_prepared_again)
    capsys.readouterr()
    assert main(["pipeline", "--output", str(out), "--quiet", *(x for item in TINY for x in ("--set", item))]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert err == [f"error: {out / 'prepared'} was prepared again while this job was reading it; run the job again"]
    assert not (out / "report").exists() and not (out / "rankings").exists()


@pytest.mark.parametrize("command", ["score", "export"])
def test_a_model_uri_where_no_store_exists_is_refused_without_creating_one(tmp_path, monkeypatch, capsys, command):
    # the usual mistake: running from another folder than the one the model was trained in
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "in").mkdir()
    assert main([command, "--model-uri", "models:/recsys-alibi-ranker/1", "--input", str(tmp_path / "in")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: cannot load model 'models:/recsys-alibi-ranker/1': there is no tracking store at "
                   f"sqlite:///{tmp_path / 'mlflow.db'} (none was created here); run from the folder where the model "
                   "was trained, or set MLFLOW_TRACKING_URI / tracking.uri to its store"]  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]  # no mlflow.db, no lock, no mlruns


def test_a_model_missing_from_an_existing_store_names_the_store(tmp_path, mlflow_store, capsys):
    (tmp_path / "in").mkdir()
    assert main(["score", "--model-uri", "models:/recsys-alibi-ranker/1", "--input", str(tmp_path / "in")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot load model 'models:/recsys-alibi-ranker/1' (")
    assert f"from the tracking store {mlflow_store};" in err[0]


def test_a_second_pipeline_on_the_same_output_is_refused_before_it_writes(tmp_path, mlflow_store, capsys):
    """Two runs on one --output would mix their files (one generating over the other's inputs): the second is
    refused with one line while the first holds the output's lock (released when its process ends)."""
    from recsys_alibi.data.prepared import prepare_lock

    out = tmp_path / "job"
    args = ["pipeline", "--output", str(out), "--quiet", *[a for item in TINY for a in ("--set", item)]]
    with prepare_lock(out, command="pipeline"):  # what a running pipeline holds
        assert main(args) == 2
        assert capsys.readouterr().err.strip() == (f"error: another `recsys-alibi pipeline` is writing {out} now; "
                                                   "wait for it or choose another --output")
        assert sorted(p.name for p in out.iterdir()) == []  # nothing generated, prepared or trained


def test_the_pipeline_carries_unchanged_users_over_from_its_own_rankings(tmp_path, mlflow_store, capsys):
    """score.changed_since=OUTPUT/rankings: read while the run scores into its staging folder. The champion is kept
    (the same data and config train the same model, which does not beat it), so every ranked user is carried."""
    out = tmp_path / "job"
    args = ["pipeline", "--output", str(out), "--quiet", *[a for item in TINY for a in ("--set", item)]]
    assert main(args) == 0
    before = pl.read_parquet(out / "rankings" / "part-*.parquet")
    capsys.readouterr()
    assert main([*args, "--set", f"score.changed_since={out / 'rankings'}"]) == 0
    printed = capsys.readouterr().out
    assert "decision: rejected (champion kept)" in printed
    assert "; carried over from the earlier rankings (history unchanged): 60\n" in printed  # every user, unranked too
    assert pl.read_parquet(out / "rankings" / "part-*.parquet").equals(before)
