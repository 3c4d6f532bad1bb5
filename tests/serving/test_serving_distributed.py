"""Two processes (torchrun, gloo) split the shards and write the same output as one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch
from serving_fixtures import Killed, kill_at, score_config, snapshot, tiny_model, vocabulary

from serving.distributed import World
from serving.manifest import read_manifest
from serving.score import score_with_model

RUNNER = Path(__file__).resolve().parent / "torchrun_score.py"


def test_two_processes_equal_one_and_resume_a_one_process_run(prepared, tmp_path):
    config = score_config()
    one = score_with_model(config, tiny_model(), vocabulary(), prepared, tmp_path / "one", progress=False)
    # a one-process run killed after its first shard, finished by two processes
    with pytest.raises(Killed):
        score_with_model(config, tiny_model(), vocabulary(), prepared, tmp_path / "two", progress=False,
                         hook=kill_at("recorded", 0))  # fmt: skip
    torch.save(tiny_model(), tmp_path / "model.pt")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(RUNNER), str(tmp_path / "model.pt"), str(prepared), str(tmp_path / "two")]  # fmt: skip
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("by 2 processes") == 2 and "(1 already done)" in proc.stdout
    assert snapshot(tmp_path / "two") == snapshot(tmp_path / "one")  # parts and manifest, byte for byte
    manifest = read_manifest(tmp_path / "two")
    assert manifest.complete and len(manifest.shards) == one.shards == 5
    rankings = pl.read_parquet(tmp_path / "two" / "part-*.parquet")
    assert rankings.height == one.rows
    assert not rankings.select(pl.struct("user_id", "rank").is_duplicated().any()).item()


def test_every_shard_goes_to_exactly_one_rank():
    worlds = [World(r, 3) for r in range(3)]
    assert sorted(s for w in worlds for s in w.shards(10)) == list(range(10))
    assert list(worlds[1].shards(10)) == [1, 4, 7]


def test_rank_0_errors_are_raised_not_swallowed():
    def fail():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        World().run_on_main(fail)
    assert World().run_on_main(lambda x: x + 1, 1) == 2
