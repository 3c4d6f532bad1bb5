"""train.batch_tokens: the datamodule serves length-bucketed batches under a padded-token budget."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from recsys_alibi.config import ConfigError
from recsys_alibi.training.datamodule import SequenceDataModule
from recsys_alibi.training.fit import fit_ranker
from tests.training.training_fixtures import TINY, tiny_config, write_walks


def test_batch_tokens_bounds_every_batch_and_trains(tmp_path):
    prepared = write_walks(tmp_path / "prepared")
    config = tiny_config(tmp_path / "out", "train.batch_tokens=128", "train.max_epochs=2")
    datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
    batches = list(datamodule.train_dataloader())
    assert all(b["inputs"].numel() <= 128 for b in batches)  # rows x longest window <= the budget
    assert sum(int(b["lengths"].sum()) for b in batches) == sum(
        int(b["lengths"].sum()) for b in SequenceDataModule(prepared, config.model, tiny_config(tmp_path).train, 0).train_dataloader()
    )  # the same windows, batched differently
    fit = fit_ranker(config, datamodule, tmp_path / "ckpt", progress=False)
    assert fit.epochs == 2 and fit.best_val_ndcg_at_10 > 0.1


def test_validation_batches_are_sorted_by_length_and_score_every_user_as_random_batches_did(tmp_path):
    """Validation users longest first under train.batch_tokens: each once, with its own target and
    window, and the validation metric of random batches of val_batch_size (the old loader)."""
    import numpy as np
    import torch
    from torch.utils.data import DataLoader

    from recsys_alibi.data.loader import collate_history_targets
    from recsys_alibi.training.module import RankerModule, metrics_from_sums, validation_sums

    prepared = write_walks(tmp_path / "prepared")
    config = tiny_config(tmp_path / "out", "train.batch_tokens=64")
    dm = SequenceDataModule(prepared, config.model, config.train, config.seed)
    loader = dm.val_dataloader()
    widths = [int(b["lengths"].max()) for b in loader]
    assert widths == sorted(widths, reverse=True) and len(widths) > 1
    assert all(b["history"].numel() <= 64 and len(b["lengths"]) <= 64 for b in loader)
    old = DataLoader(loader.dataset, batch_size=config.train.val_batch_size, collate_fn=collate_history_targets)

    def served(batches) -> list[tuple]:
        return sorted((tuple(b["seen"][r][b["seen"][r] > 0].tolist()), int(b["targets"][r]))
                      for b in batches for r in range(len(b["targets"])))  # fmt: skip

    assert served(loader) == served(old)  # every validation user once, with its target
    torch.manual_seed(0)
    module = RankerModule(config.model, config.train, dm.n_items, exclude_seen=True).eval()
    metrics = []
    for batches in (loader, old):
        with torch.no_grad():
            for i, batch in enumerate(batches):
                module.validation_step(batch, i)
        ranks = torch.cat(module._val_ranks).numpy()
        module._val_ranks.clear()
        metrics.append(metrics_from_sums(validation_sums(ranks)))
    assert metrics[0].keys() == metrics[1].keys()
    for name in metrics[0]:
        assert np.isclose(metrics[0][name], metrics[1][name], rtol=1e-9), name


def test_packing_and_batch_tokens_together_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="batch_tokens"):
        tiny_config(tmp_path, "train.packing=true", "train.batch_tokens=128")


# --- data-parallel training: the same number of steps on every rank (issue 31, defect 11)


def test_ddp_ranks_take_equal_token_budget_steps_every_epoch(tmp_path):
    prepared = write_walks(tmp_path / "prepared")
    config = tiny_config(tmp_path / "out", "train.batch_tokens=64")
    ranks = [SequenceDataModule(prepared, config.model, config.train, config.seed) for _ in range(2)]
    for r, dm in enumerate(ranks):
        dm.load(r, 2)
    loaders = [dm.train_dataloader() for dm in ranks]
    for epoch in range(4):
        for loader in loaders:
            loader.batch_sampler.set_epoch(epoch)
        served = [list(loader.batch_sampler) for loader in loaders]
        assert len(served[0]) == len(served[1]) == len(loaders[0]) == len(loaders[1])  # gloo aborted on 38 vs 42
        for loader, batches in zip(loaders, served):
            windows = loader.dataset
            assert sorted(i for b in batches for i in b) == list(range(len(windows)))  # each window once
            assert all(len(b) * max(windows.ends[b] - windows.starts[b]) <= 64 for b in batches)


@pytest.mark.slow
def test_cli_ddp_with_batch_tokens_trains_on_two_processes(tmp_path, new_store):
    """``train.batch_tokens`` with ``train.devices=2 train.strategy=ddp`` (gloo): exit 0, one run."""
    prepared = write_walks(tmp_path / "prepared")
    args = [sys.executable, "-m", "pipelines.cli", "train", "--prepared", str(prepared), "--quiet"]
    for item in [*TINY, "train.max_epochs=1", "train.batch_tokens=64", f"output={tmp_path / 'job'}",
                 "train.devices=2", "train.strategy=ddp", "train.accelerator=cpu"]:  # fmt: skip
        args += ["--set", item]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "MLFLOW_TRACKING_URI": new_store(tmp_path / "mlflow.db")}  # fmt: skip
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained 1 epoch on 2 processes" in proc.stdout and proc.stdout.count("mlflow_run_id: ") == 1
