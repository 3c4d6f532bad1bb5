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


def test_resume_is_refused_on_other_data_and_allowed_on_a_copy_of_the_same(tmp_path, mlflow_store, capsys):
    first = _walks(tmp_path / "first", 12, "a")
    output = tmp_path / "job"
    assert main(_train(first, output)) == 0
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.data.tags[SPLIT_TAG] == "leave_one_out" and len(run.data.tags[DATA_TAG]) == 64
    (marker,) = (output / "checkpoints").glob(f"*/{COMPLETE_MARKER}")
    marker.unlink()  # as if the run had been killed after its last epoch
    capsys.readouterr()

    renamed = _walks(tmp_path / "renamed", 12, "b")  # same counts of users, items, events; other item ids
    bigger = _walks(tmp_path / "bigger", 15, "a")  # another catalog size: its table would not fit
    for prepared, extra in ((renamed, ()), (bigger, ()), (first, ("evaluate.protocol=temporal",))):
        assert main([*_train(prepared, output, *extra), "--resume"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: cannot resume") and "other data" in err[0], err
    assert "data sha256" in err[0] or "split" in err[0]

    copy = tmp_path / "copy"
    shutil.copytree(first, copy)  # the same content elsewhere: the same run continues
    assert main([*_train(copy, output), "--resume"]) == 0
    assert f"mlflow_run_id: {run.info.run_id}" in capsys.readouterr().out
    assert len(mlflow.search_runs(search_all_experiments=True, output_format="list")) == 1


def test_the_split_tag_names_the_temporal_cutoff(tmp_path, mlflow_store):
    first = _walks(tmp_path / "first", 12, "a")
    assert main(_train(first, tmp_path / "job", "evaluate.protocol=temporal", "evaluate.temporal_cutoff=6")) == 0
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.data.tags[SPLIT_TAG] == "temporal<6"
    # 40 users with 6 events before t=6: each trains on 5 of them
    assert run.data.metrics["data.train_events"] == pytest.approx(40 * 5)
