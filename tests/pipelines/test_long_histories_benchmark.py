"""benchmarks/long_histories.py: fixed max_len and short-to-long schedules, per seed, paired to max_len 200.

The training itself is replaced by a stand-in whose per-user metrics are known, so the JSON's
shape, the pairing (same seed, reference = the first --max-lens) and the resume are checked in a
second; the schedule's training is tested in tests/training/test_context_schedule.py.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import shlex
import sys
import types
from pathlib import Path

import polars as pl
import pytest
from benchmark_scripts import load_benchmark, load_module

REPO = Path(__file__).resolve().parents[2]



long_histories = load_benchmark("long_histories", "long_histories_benchmark")
_walk_fixtures = load_module(REPO / "tests" / "training" / "training_fixtures.py", "walk_fixtures")
write_walks = _walk_fixtures.write_walks
NO_TABLE = [arg for item in _walk_fixtures.NO_ITEM_TABLE for arg in ("--set", item)]  # default.yaml's item table

OFFSET = {"200": 0.0, "16": 0.05}  # per-user NDCG@10 above the reference; a schedule: +0.1


def _fake_run_one(calls: list):
    def run_one(config, prepared, label, threads):
        schedule = config.train.context_schedule
        entry = {"schedule": schedule} if schedule else {"max_len": config.model.max_len}
        calls.append((config.seed, long_histories.entry_name(entry)))
        offset = 0.1 if schedule else OFFSET[str(config.model.max_len)]
        per_user = [0.1 + offset + 0.01 * u for u in range(5)]
        record = {"max_len": config.model.max_len, **entry, "seed": config.seed, "run_id": "r", "epochs": 2,
                  "train_seconds": 1.0, "n_users": 5, "NDCG@10": sum(per_user) / 5, "HR@10": 0.5,
                  "slices": {">=200": {"NDCG@10": 0.0, "HR@10": 0.0, "n_users": 0}}, "val_curve": [0.1, 0.2],
                  "torch_threads": threads}  # fmt: skip
        arrays = {"user_ids": list(range(5)), "lengths": [3, 10, 250, 600, 20], "NDCG@10": per_user,
                  "HR@10": [1.0, 0.0, 1.0, 0.0, 1.0]}  # fmt: skip
        return record, arrays

    return run_one


@contextlib.contextmanager
def _threads_pool(jobs: int):
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        yield pool, 1


def test_schedules_and_seeds_are_recorded_paired_to_200_of_the_same_seed_and_resumed(tmp_path, monkeypatch, capsys):
    prepared = write_walks(tmp_path / "prepared", n_users=40)
    whole = int(pl.read_parquet(prepared / "sequences.parquet").get_column("length").max())
    calls: list = []
    monkeypatch.setattr(long_histories, "run_one", _fake_run_one(calls))
    monkeypatch.setitem(sys.modules, "worker_pool", types.SimpleNamespace(training_pool=_threads_pool))
    monkeypatch.setattr("recsys_alibi.tracking.setup_tracking", lambda tracking: None)  # nothing is tracked
    out = tmp_path / "converged.json"
    argv = ["--config", str(REPO / "configs" / "default.yaml"), "--prepared", str(prepared),
            "--max-lens", "200", "16", "--schedules", "[[0, 4], [1, whole]]", "--seeds", "1", "2",
            "--threads", "1", "--set", "train.max_epochs=2", *NO_TABLE, "--json", str(out)]  # fmt: skip
    assert long_histories.main(argv) == 0
    schedule = [[0, 4], [1, whole]]
    assert sorted(calls) == sorted((s, n) for s in (1, 2) for n in ("200", "16", f"schedule {schedule}"))
    runs = json.loads(out.read_text())["runs"]
    assert len(runs) == 6
    for run in runs:
        assert {"max_len", "seed", "epochs", "train_seconds", "NDCG@10", "HR@10", "slices"} <= run.keys()
        if run.get("schedule"):
            assert run["schedule"] == schedule and run["max_len"] == whole and run["whole"]
            assert run["ci95"]["all"]["NDCG@10"]["difference"] == pytest.approx(0.1)
            assert run["ci95"]["all"]["NDCG@10"]["ci95"] == pytest.approx([0.1, 0.1])
            assert run["ci95"][">=200"]["NDCG@10"]["n_users"] == 2 and run["ci95"][">=500"]["NDCG@10"]["n_users"] == 1
        elif run["max_len"] == 16:
            assert run["ci95"]["all"]["NDCG@10"]["difference"] == pytest.approx(0.05)
        else:
            assert "ci95" not in run  # the reference
    assert f"| 2 | {schedule} | 2 |" in capsys.readouterr().out  # the table names the schedule

    calls.clear()  # the same command again: every run is in the JSON, nothing trains
    assert long_histories.main(argv) == 0
    assert calls == [] and len(json.loads(out.read_text())["runs"]) == 6


def test_the_json_folder_is_made_before_training_and_the_command_is_the_one_run(tmp_path, monkeypatch):
    """--json in a folder that does not exist: made before the first run trains (a finished run was lost to a
    FileNotFoundError at the end); ``command`` is the command line as given, ``machine`` names the CPU."""
    prepared = write_walks(tmp_path / "prepared", n_users=40)
    out = tmp_path / "new" / "folder" / "lh.json"
    calls: list = []
    fake = _fake_run_one(calls)

    def run_one(config, prepared, label, threads):
        assert out.parent.is_dir(), "the JSON's folder is made before any training"
        return fake(config, prepared, label, threads)

    monkeypatch.setattr(long_histories, "run_one", run_one)
    monkeypatch.setitem(sys.modules, "worker_pool", types.SimpleNamespace(training_pool=_threads_pool))
    monkeypatch.setattr("recsys_alibi.tracking.setup_tracking", lambda tracking: None)
    argv = ["--config", str(REPO / "configs" / "default.yaml"), "--prepared", str(prepared), "--max-lens", "200",
            "--seeds", "1", "--set", "train.max_epochs=2", *NO_TABLE, "--json", str(out)]  # fmt: skip
    assert long_histories.main(argv) == 0 and calls == [(1, "200")]
    doc = json.loads(out.read_text())
    assert doc["command"] == shlex.join(["python", "benchmarks/long_histories.py", *argv])
    assert " cores, Python " in doc["machine"] and len(doc["runs"]) == 1


def test_runs_recorded_before_seeds_keep_their_keys():
    """The per-user file of the earlier equal-budget JSON is keyed ``label|max_len``."""
    assert long_histories.run_key("time gaps", None, {"max_len": 200}) == "time gaps|200"
    assert long_histories.run_key("", 42, {"max_len": 200, "schedule": [[0, 200], [25, 1000]]}) == (
        "|42|schedule [[0, 200], [25, 1000]]"
    )


def test_an_invalid_schedule_is_one_error_line(tmp_path, capsys):
    prepared = write_walks(tmp_path / "prepared", n_users=40)
    argv = ["--config", str(REPO / "configs" / "default.yaml"), "--prepared", str(prepared),
            "--schedules", "[[3, 200]]", *NO_TABLE, "--json", str(tmp_path / "x.json")]  # fmt: skip
    assert long_histories.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "must start at epoch 0" in err[0]
    assert not (tmp_path / "x.json").exists()


def test_a_run_killed_mid_way_resumes_from_its_checkpoint_and_equals_an_uninterrupted_one(
    tmp_path, monkeypatch, mlflow_store, one_torch_thread
):
    """Real tiny training (one thread): a run killed at the start of epoch 2 is continued by the same
    command from its epoch-1 ``last.ckpt`` (not from epoch 0) and records what an uninterrupted run does."""
    import pipelines.train

    fixtures = load_module(REPO / "tests" / "training" / "training_fixtures.py", "training_fixtures_for_resume")
    prepared = write_walks(tmp_path / "prepared", n_users=60)
    monkeypatch.setitem(sys.modules, "worker_pool", types.SimpleNamespace(training_pool=_threads_pool))
    real_callbacks = pipelines.train.training_callbacks
    tiny = [f"--set={o}" for o in [*fixtures.TINY, *fixtures.NO_ITEM_TABLE, "train.max_epochs=4", "evaluate.batch_size=32"]]

    def argv(name: str) -> list[str]:
        return ["--config", str(REPO / "configs" / "default.yaml"), "--prepared", str(prepared), "--max-lens", "16",
                "--seeds", "3", "--threads", "1", *tiny, f"--set=output={tmp_path / name}",
                "--json", str(tmp_path / f"{name}.json")]  # fmt: skip

    assert long_histories.main(argv("uninterrupted")) == 0
    monkeypatch.setattr(pipelines.train, "training_callbacks", lambda config: [*real_callbacks(config), fixtures.KillAt(2)])
    with pytest.raises(fixtures.Killed):
        long_histories.main(argv("killed"))
    assert not (tmp_path / "killed.json").exists() or json.loads((tmp_path / "killed.json").read_text())["runs"] == []
    monkeypatch.setattr(pipelines.train, "training_callbacks", real_callbacks)
    assert long_histories.main(argv("killed")) == 0  # the same command again

    (full,) = json.loads((tmp_path / "uninterrupted.json").read_text())["runs"]
    (resumed,) = json.loads((tmp_path / "killed.json").read_text())["runs"]
    assert full["resumed_from"] is None
    assert resumed["resumed_from"] is not None and resumed["resumed_from"].endswith("last.ckpt")
    assert resumed["epochs"] == full["epochs"] == 4
    assert resumed["val_curve"] == full["val_curve"] and len(full["val_curve"]) == 4  # the epochs before the kill kept
    assert resumed["NDCG@10"] == full["NDCG@10"] and resumed["HR@10"] == full["HR@10"]
