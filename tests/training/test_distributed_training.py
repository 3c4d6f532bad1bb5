"""Training on one process and on two CPU processes (gloo), killed and resumed.

Tolerances (measured on this 2-core machine, tiny config of ``training_fixtures.TINY``):

- the same weights validated on 1 and on 2 processes: equal up to float noise (1e-6): the
  per-user sums and counts are all-reduced, not per-rank means;
- a run killed and resumed on the same number of processes: equal to the uninterrupted run
  (measured bit-identical; 1e-6), because the shuffle and the random state of every step are
  functions of (seed, epoch or step, rank) and Lightning restores epoch, optimiser and schedule;
- 1 process against 2 processes, and a 2-process run resumed on 1 process: the ranks see other
  batches (each rank shuffles its own users), so SGD takes another path; validation NDCG@10
  agrees within ``SGD_TOL`` = 0.06. For scale: 1-process runs with seeds 0..9 of the same config
  spread over 0.060 (max - min), standard deviation 0.023 (``benchmarks/scaling.py --agreement``,
  docs/scaling.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import polars as pl
import pytest
import torch
from training_fixtures import TINY, KillAt, Killed, tiny_config, validate_initial, write_walks

import pipelines.train
from pipelines.cli import main
from recsys_alibi.config import ConfigError
from recsys_alibi.data.partition import read_sequence_rows, row_groups_of, train_part, valid_part
from recsys_alibi.data.schema import ITEM_IDX, LENGTH, SEQUENCES_FILE, USER_ID
from recsys_alibi.evaluation.metrics import hit_rate_at_k, mrr, ndcg_at_k
from recsys_alibi.training.datamodule import SequenceDataModule
from recsys_alibi.training.fit import FitResult, fit_ranker
from recsys_alibi.training.module import metrics_from_sums, validation_sums

HERE = Path(__file__).resolve().parent
SGD_TOL = 0.06
EXACT_TOL = 1e-6
MONITOR = "val/ndcg_at_10"
QUIET_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return write_walks(tmp_path_factory.mktemp("walks") / "prepared")


@pytest.fixture(scope="module")
def one_process(prepared, tmp_path_factory) -> FitResult:
    """The uninterrupted reference: the tiny config trained on one process."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("one")
    config = tiny_config(out)
    datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
    return fit_ranker(config, datamodule, out / "checkpoints", progress=False)


# ---- each rank reads its part ------------------------------------------------------------


def test_parts_cover_every_user_and_each_rank_reads_only_its_row_groups(prepared):
    path = prepared / SEQUENCES_FILE
    rows = np.arange(pl.read_parquet(path, columns=[LENGTH]).height)
    parts = [train_part(rows, r, 2) for r in range(2)]
    assert len(parts[0]) == len(parts[1]) == 120 and set(np.concatenate(parts)) == set(rows)
    groups = [set(row_groups_of(path, p).tolist()) for p in parts]
    assert groups[0] == {0, 1, 2, 3} and groups[1] == {3, 4, 5, 6, 7}  # 32-row groups; only #3 is shared
    assert np.array_equal(np.concatenate([valid_part(rows, r, 3) for r in range(3)]), rows)
    assert train_part(np.arange(5), 1, 2).tolist() == [3, 4, 0]  # padded by wrapping around
    picked = np.array([200, 3, 3, 64])
    got = read_sequence_rows(prepared, picked, [USER_ID, ITEM_IDX])
    assert got.equals(pl.read_parquet(path, columns=[USER_ID, ITEM_IDX])[picked])


def test_datamodule_parts_have_equal_steps_disjoint_validation_and_global_counts(prepared):
    config = tiny_config(Path("unused"))
    one = SequenceDataModule(prepared, config.model, config.train, config.seed)
    one.load(0, 1)
    ranks = [SequenceDataModule(prepared, config.model, config.train, config.seed) for _ in range(2)]
    for r, dm in enumerate(ranks):
        dm.load(r, 2)
    assert [len(dm.train_dataloader()) for dm in ranks] == [len(one.train_dataloader())] * 2
    assert [dm.per_rank_batch_size() for dm in ranks] == [16, 16]
    assert sum(len(dm.valid_targets) for dm in ranks) == len(one.valid_targets)
    assert np.array_equal(np.concatenate([dm.valid_targets for dm in ranks]), one.valid_targets)
    assert torch.equal(ranks[0].item_counts() + ranks[1].item_counts(), one.item_counts())
    odd = tiny_config(Path("unused"), "train.batch_size=33")
    with pytest.raises(ConfigError, match="global batch"):
        SequenceDataModule(prepared, odd.model, odd.train, odd.seed).load(0, 2)
    whole = tiny_config(Path("unused"), "train.windows=all")
    with pytest.raises(ConfigError, match="one training process"):
        SequenceDataModule(prepared, whole.model, whole.train, whole.seed).load(0, 2)
    single = SequenceDataModule(prepared, whole.model, whole.train, whole.seed)
    single.load(0, 1)
    windows = single.train_dataloader().dataset
    assert sum(len(windows[i]) - 1 for i in range(len(windows))) == single.n_train_events - single.n_train_users


def test_validation_sums_of_parts_give_the_one_process_metrics():
    ranks = np.random.default_rng(0).integers(1, 40, 101)
    summed = validation_sums(ranks[:37]) + validation_sums(ranks[37:]) + validation_sums(ranks[:0])
    got = metrics_from_sums(summed)
    assert got[MONITOR] == pytest.approx(ndcg_at_k(ranks, 10), abs=1e-12)
    assert got["val/hr_at_10"] == pytest.approx(hit_rate_at_k(ranks, 10), abs=1e-12)
    assert got["val/mrr"] == pytest.approx(mrr(ranks), abs=1e-12)
    assert metrics_from_sums(validation_sums(ranks[:0])) == {}


# ---- one process against two -------------------------------------------------------------


def test_torchrun_two_processes_validate_like_one_and_a_killed_run_resumes_on_one(prepared, one_process, tmp_path):
    """2 gloo processes (torchrun): same-weights validation, then a run killed at epoch 2 that
    one process finishes from ``last.ckpt`` (a checkpoint written by 2 processes, read by 1)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(HERE / "torchrun_fit.py"), str(prepared), str(tmp_path / "two"), "2"]  # fmt: skip
    proc = subprocess.run(cmd, env=QUIET_ENV, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))

    single = validate_initial(tiny_config(tmp_path / "v"), prepared)
    for name, value in single.items():
        assert result["validate"][name] == pytest.approx(value, abs=EXACT_TOL), name

    last = Path(result["last"])
    assert torch.load(last, map_location="cpu", weights_only=False)["epoch"] == 1  # epochs 0 and 1 done
    config = tiny_config(tmp_path / "resumed")
    datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
    resumed = fit_ranker(config, datamodule, last.parent, progress=False, resume_from=last)  # the same directory
    assert resumed.epochs == one_process.epochs == 3
    assert resumed.val_metrics[MONITOR] == pytest.approx(one_process.val_metrics[MONITOR], abs=SGD_TOL)


def test_cli_ddp_two_processes_one_mlflow_run_close_to_one_process(prepared, one_process, tmp_path, new_store):
    """``train.devices=2 train.strategy=ddp``: Lightning starts the second process itself."""
    uri = new_store(tmp_path / "mlflow.db")
    args = [sys.executable, "-m", "pipelines.cli", "train", "--prepared", str(prepared), "--quiet"]
    for item in [*TINY, f"output={tmp_path / 'job'}", "train.devices=2", "train.strategy=ddp", "train.accelerator=cpu"]:
        args += ["--set", item]
    proc = subprocess.run(args, cwd=tmp_path, env={**QUIET_ENV, "MLFLOW_TRACKING_URI": uri}, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_lines = [x for x in proc.stdout.splitlines() if x.startswith("mlflow_run_id: ")]
    assert len(run_lines) == 1 and "on 2 processes" in proc.stdout  # rank 1 printed nothing
    run_id = run_lines[0].split(": ", 1)[1]

    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert [r.info.run_id for r in runs] == [run_id]  # no run from rank 1
    metrics = runs[0].data.metrics
    assert metrics["train.world_size"] == 2.0 and runs[0].info.status == "FINISHED"
    config = tiny_config(tmp_path)
    assert metrics["data.users"] == SequenceDataModule(prepared, config.model, config.train, config.seed).n_train_users
    assert metrics[MONITOR] == pytest.approx(one_process.val_metrics[MONITOR], abs=SGD_TOL)
    versions = mlflow.MlflowClient().search_model_versions("name='recsys-alibi-ranker'")
    assert [v.run_id for v in versions] == [run_id]
    assert (tmp_path / "job" / "checkpoints" / run_id / "COMPLETE").is_file()


# ---- killed and resumed on the same number of processes ----------------------------------


def test_cli_train_killed_then_resume_finishes_the_same_run_with_the_same_metrics(
    prepared, one_process, tmp_path, mlflow_store, monkeypatch, capsys
):
    args = ["train", "--prepared", str(prepared), "--quiet"]
    for item in [*TINY, f"output={tmp_path / 'job'}"]:
        args += ["--set", item]
    monkeypatch.setattr(pipelines.train, "training_callbacks", lambda config: [KillAt(2)])
    assert main(args) == 1  # the traceback, then one line
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: train failed: Killed")
    (killed,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert killed.info.status == "FAILED"
    monkeypatch.setattr(pipelines.train, "training_callbacks", lambda config: [])
    capsys.readouterr()

    for other in ("model.d_model=32", "model.time_gap_buckets=8"):  # weights that cannot fit: refused first
        assert main([*args, "--resume", "--set", other]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "cannot resume" in err[0] and f"{other.split('=')[0]}=" in err[0]
    assert main([*args, "--resume"]) == 0
    printed = capsys.readouterr().out
    assert f"mlflow_run_id: {killed.info.run_id}" in printed and "resumed from" in printed
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.info.status == "FINISHED" and run.data.tags["recsys_alibi.resumed_from"].endswith("last.ckpt")
    for name in (MONITOR, "val/hr_at_10", "val/mrr"):
        assert run.data.metrics[name] == pytest.approx(one_process.val_metrics[name], abs=EXACT_TOL), name
    assert run.data.metrics["best_val_ndcg_at_10"] == pytest.approx(one_process.best_val_ndcg_at_10, abs=EXACT_TOL)
    history = mlflow.MlflowClient().get_metric_history(run.info.run_id, MONITOR)
    assert sorted(m.step for m in history) == sorted({m.step for m in history})  # epoch 2 logged once
    assert len(history) == 3


def test_sharded_item_table_with_the_full_softmax_is_one_clear_config_error(prepared, tmp_path, capsys):
    assert main(["train", "--prepared", str(prepared), "--set", "model.shard_embeddings=true",
                 "--set", f"output={tmp_path}"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model.shard_embeddings=true") and "scaling.md" in err[0]
    assert "train.loss=sampled_softmax" in err[0]  # the default full softmax needs the whole table
