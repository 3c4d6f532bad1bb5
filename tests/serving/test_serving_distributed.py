"""Two processes (torchrun, gloo) split the shards and write the same output as one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from serving_fixtures import score_config, tiny_model, vocabulary

from recsys_alibi.config import with_overrides
from serving.manifest import read_manifest
from serving.score import run_score, score_with_model
from test_serving_resume import Killed, kill_at, snapshot

SETTINGS = ["score.k=10", "score.shard_users=5", "score.batch_size=4", "score.catalog_chunk=7",
            "score.attention_backend=sdpa", "score.device=cpu"]  # the same as score_config()


def _log_model(tmp_path: Path) -> str:
    import mlflow

    from recsys_alibi.tracking import log_ranker, setup_tracking

    config = score_config()
    setup_tracking(config.tracking)
    with mlflow.start_run():
        return log_ranker(tiny_model(), vocabulary(), None, tmp_path / "artifacts").uri


def _torchrun_score(model_uri: str, input_path: Path, output: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "0",
           "-m", "pipelines.cli", "score", "--model-uri", model_uri, "--input", str(input_path),
           "--output", str(output), "--quiet"]
    for item in SETTINGS:
        cmd += ["--set", item]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_two_processes_equal_one_and_resume_a_one_process_run(prepared, tmp_path, mlflow_store):
    model_uri = _log_model(tmp_path)
    config = score_config()
    one = run_score(config, model_uri, prepared, tmp_path / "one", progress=False)  # loads from MLflow
    # a one-process run killed after its first shard, finished by two processes
    with pytest.raises(Killed):
        score_with_model(config, tiny_model(), vocabulary(), prepared, tmp_path / "two", progress=False,
                         model_ref={"model_uri": model_uri, "run_id": model_uri.split("/")[1]},
                         hook=kill_at("recorded", 0))  # fmt: skip
    proc = _torchrun_score(model_uri, prepared, tmp_path / "two")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "by 2 processes" in proc.stdout and "(1 already done)" in proc.stdout
    assert snapshot(tmp_path / "two") == snapshot(tmp_path / "one")
    manifest = read_manifest(tmp_path / "two")
    assert manifest.complete and len(manifest.shards) == one.shards == 5
    rankings = pl.read_parquet(tmp_path / "two" / "part-*.parquet")
    assert rankings.height == one.rows and not rankings.select(pl.struct("user_id", "rank").is_duplicated().any()).item()


def test_every_shard_to_exactly_one_rank():
    from serving.distributed import World

    worlds = [World(r, 3) for r in range(3)]
    owned = sorted(s for w in worlds for s in w.shards(10))
    assert owned == list(range(10)) and list(worlds[1].shards(10)) == [1, 4, 7]


def test_rank_0_errors_reach_every_rank():
    from serving.distributed import World

    with pytest.raises(ValueError, match="boom"):
        World().run_on_main(lambda: (_ for _ in ()).throw(ValueError("boom")))
    assert World().run_on_main(lambda x: x + 1, 1) == 2


def test_config_copies_are_independent():
    assert with_overrides(score_config(), score={"k": 3}).score.k == 3 and score_config().score.k == 10
