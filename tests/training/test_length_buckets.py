"""train.batch_tokens: the datamodule serves length-bucketed batches under a padded-token budget."""

from __future__ import annotations

import pytest

from recsys_alibi.config import ConfigError
from recsys_alibi.training.datamodule import SequenceDataModule
from recsys_alibi.training.fit import fit_ranker
from tests.training.training_fixtures import tiny_config, write_walks


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


def test_packing_and_batch_tokens_together_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="batch_tokens"):
        tiny_config(tmp_path, "train.packing=true", "train.batch_tokens=128")
