"""Rank before Lightning starts, the checkpoint a resume picks, and a fit leaving no group behind."""

from __future__ import annotations

import os
import time

import pytest
import torch.distributed as dist

from pipelines.pipeline import check_pipeline_launch
from recsys_alibi.config import ConfigError, load_config
from recsys_alibi.training.fit import _process_group_released
from recsys_alibi.training.launch import launch_rank, mark_complete, resumable_checkpoint


def test_launch_rank_from_each_launcher():
    assert launch_rank(2, {}) == 0  # alone, or the process that Lightning's launcher starts from
    assert launch_rank(2, {"RANK": "3", "LOCAL_RANK": "1"}) == 3  # torchrun
    assert launch_rank(2, {"LOCAL_RANK": "1", "WORLD_SIZE": "2"}) == 1  # started by Lightning
    assert launch_rank(2, {"LOCAL_RANK": "1", "NODE_RANK": "1"}) == 3  # Lightning, second node
    assert launch_rank(4, {"NODE_RANK": "1"}) == 4  # the launching process of the second node
    assert launch_rank(1, {"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}) == 5  # srun
    assert launch_rank(1, {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) == 0
    assert launch_rank("auto", {"LOCAL_RANK": "1"}) == 1


def test_resume_picks_the_newest_unfinished_checkpoint(tmp_path):
    assert resumable_checkpoint(tmp_path / "none") is None
    for run in ("old", "new", "done"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "last.ckpt").write_bytes(b"x")
        time.sleep(0.01)
    mark_complete(tmp_path / "done")
    assert resumable_checkpoint(tmp_path) == tmp_path / "new" / "last.ckpt"
    mark_complete(tmp_path / "new")
    mark_complete(tmp_path / "old")
    assert resumable_checkpoint(tmp_path) is None


def test_a_group_formed_during_the_fit_is_released_with_the_launcher_variables(monkeypatch, tmp_path):
    for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "RANK"):
        monkeypatch.delenv(key, raising=False)
    with _process_group_released():  # what Lightning's launcher does inside trainer.fit
        os.environ.update({"WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"})
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    assert not dist.is_initialized()
    assert "WORLD_SIZE" not in os.environ and "LOCAL_RANK" not in os.environ and "MASTER_ADDR" not in os.environ


def test_pipeline_refuses_a_launcher_that_starts_every_rank_at_once():
    config = load_config()
    check_pipeline_launch(config, {})
    check_pipeline_launch(config, {"LOCAL_RANK": "1", "WORLD_SIZE": "2"})  # Lightning's own launcher
    for env in ({"RANK": "0", "WORLD_SIZE": "2"}, {"SLURM_NTASKS": "4", "SLURM_PROCID": "0"}):
        with pytest.raises(ConfigError, match="recsys-alibi prepare"):
            check_pipeline_launch(config, env)
