"""``train --resume`` continues a run only on the data it trained on (same content, same split)."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlflow
import numpy as np
import pytest

from pipelines.cli import main
from pipelines.train import DATA_TAG, SPLIT_TAG
from recsys_alibi.config import DataConfig
from recsys_alibi.data.prepare import prepare
from recsys_alibi.training.launch import COMPLETE_MARKER

TINY = [
    "model.d_model=8", "model.n_heads=2", "model.n_layers=1", "model.max_len=8", "model.attention_backend=sdpa",
    "train.max_epochs=1", "train.batch_size=16", "train.warmup_steps=1", "train.attention_health=false",
]  # fmt: skip


def _walks(path: Path, n_items: int, prefix: str, seed: int = 0) -> Path:
    """Events of 40 users walking a catalog of ``n_items`` items named ``prefix<k>``; prepared into ``path``."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(40):
        start = int(rng.integers(0, n_items))
        rows += [f"{u},{prefix}{(start + t) % n_items},{t}" for t in range(8)]
    events = path.with_suffix(".csv")
    events.write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    prepare(DataConfig(min_events_per_user=1, min_events_per_item=1), events, path)
    return path


def _train(prepared: Path, output: Path, *extra: str) -> list[str]:
    args = ["train", "--prepared", str(prepared), "--quiet", "--set", f"output={output}"]
    for item in [*TINY, *extra]:
        args += ["--set", item]
    return args


def _killed(output: Path, run_id: str) -> Path:
    """Make the finished run ``run_id`` look killed after its last epoch (no COMPLETE marker)."""
    (output / "checkpoints" / run_id / COMPLETE_MARKER).unlink()
    return output / "checkpoints" / run_id


def _run_ids() -> list[str]:
    return [r.info.run_id for r in mlflow.search_runs(search_all_experiments=True, output_format="list")]


def test_resume_on_other_data_starts_a_new_run_and_moves_the_stale_checkpoint_aside(tmp_path, mlflow_store, capsys, caplog):
    """A nightly `--resume` killed once must not block the next nights, whose data changed."""
    first = _walks(tmp_path / "first", 12, "a")
    output = tmp_path / "job"
    assert main(_train(first, output)) == 0
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.data.tags[SPLIT_TAG] == "leave_one_out" and len(run.data.tags[DATA_TAG]) == 64
    killed = _killed(output, run.info.run_id)
    capsys.readouterr()

    def moved_lines() -> list[str]:
        lines = [r.getMessage() for r in caplog.records if "trained on other data" in r.getMessage()]
        caplog.clear()
        return lines

    renamed = _walks(tmp_path / "renamed", 12, "b")  # same counts of users, items, events; other item ids
    assert main([*_train(renamed, output), "--resume"]) == 0
    (new_run,) = set(_run_ids()) - {run.info.run_id}
    assert f"mlflow_run_id: {new_run}" in capsys.readouterr().out
    (moved,) = moved_lines()
    assert run.info.run_id in moved and "data sha256" in moved and "a new run starts" in moved
    assert not killed.exists() and (output / "checkpoints" / "stale" / run.info.run_id / "last.ckpt").is_file()
    assert main([*_train(renamed, output), "--resume"]) == 0  # nothing unfinished now: another new run
    assert len(_run_ids()) == 3

    # a checkpoint from before data.json: compared with its MLflow run (here: another split)
    (older,) = set(_run_ids()) - {run.info.run_id, new_run}
    stale = _killed(output, older)
    (output / "checkpoints" / f"{older}.data.json").unlink()
    assert main([*_train(renamed, output, "evaluate.protocol=temporal"), "--resume"]) == 0
    (moved,) = moved_lines()
    assert older in moved and "split leave_one_out (now temporal<" in moved and not stale.exists()
    assert len(_run_ids()) == 4

    copy = tmp_path / "copy"
    shutil.copytree(first, copy)  # the same content elsewhere: the same run continues
    (again,) = set(_run_ids()) - {run.info.run_id, new_run, older}
    _killed(output, again)  # trained on `renamed` under temporal: not this data
    shutil.move(output / "checkpoints" / "stale" / run.info.run_id, output / "checkpoints" / run.info.run_id)
    assert main([*_train(copy, output), "--resume"]) == 0
    assert f"mlflow_run_id: {run.info.run_id}" in capsys.readouterr().out and len(_run_ids()) == 4
    assert (output / "checkpoints" / "stale" / again).is_dir() and len(moved_lines()) == 1  # moved aside on the way


def test_the_split_tag_names_the_temporal_cutoff(tmp_path, mlflow_store):
    first = _walks(tmp_path / "first", 12, "a")
    assert main(_train(first, tmp_path / "job", "evaluate.protocol=temporal", "evaluate.temporal_cutoff=6")) == 0
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.data.tags[SPLIT_TAG] == "temporal<6"
    # 40 users with 6 events before t=6: each trains on 5 of them
    assert run.data.metrics["data.train_events"] == pytest.approx(40 * 5)


def test_a_prepare_completed_while_training_runs_fails_the_job_and_logs_no_model(tmp_path, mlflow_store, capsys,
                                                                                 monkeypatch):  # fmt: skip
    """The model must never be logged with a vocabulary other than the one its weights were trained on."""
    import pipelines.train as train_job

    prepared = _walks(tmp_path / "prepared", 12, "a")
    real_fit = train_job.fit_ranker

    def fit_then_prepare_again(*args, **kwargs):
        fitted = real_fit(*args, **kwargs)
        _walks(prepared, 15, "z", seed=1)  # another catalog published into the same directory meanwhile
        return fitted

    monkeypatch.setattr(train_job, "fit_ranker", fit_then_prepare_again)
    capsys.readouterr()
    assert main(_train(prepared, tmp_path / "job")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == f"error: {prepared} was prepared again while this job was reading it; run the job again"
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.info.status == "FAILED" and "best_val_ndcg_at_10" not in run.data.metrics
    assert [a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)] == ["job_config.json"]
    assert mlflow.search_logged_models(output_format="list") == []  # no model logged,
    assert mlflow.MlflowClient().search_model_versions() == []  # none registered


def test_the_logged_pyfunc_serves_under_the_configs_seen_item_rule(tmp_path, mlflow_store):
    """Issue 31 defect 3: one exclude_seen for evaluate, score and the pyfunc. A pyfunc called without
    the param takes the signature's default, which must be the training config's, not always true."""
    prepared = _walks(tmp_path / "data", 12, "a")
    assert main(_train(prepared, tmp_path / "job", "evaluate.exclude_seen=false")) == 0
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    pyfunc = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
    assert {p.name: p.default for p in pyfunc.metadata.get_params_schema().params}["exclude_seen"] is False


def test_a_plain_train_beside_an_unfinished_run_says_resume_would_continue_it(tmp_path, mlflow_store, capsys, caplog):
    # the same command again after a kill -9 started afresh without a word about the run --resume continues
    walks = _walks(tmp_path / "walks", 12, "a")
    output = tmp_path / "job"
    assert main(_train(walks, output)) == 0
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    killed = _killed(output, run.info.run_id)
    caplog.clear()
    assert main(_train(walks, output)) == 0
    assert [r.getMessage() for r in caplog.records if "an unfinished run" in r.getMessage()] == [
        f"an unfinished run is under {killed} (killed, or still running); --resume (train.resume=true) continues it "
        "when it trained on this data; this run starts a new one"]
