"""``train.num_workers``: worker processes collate the same batches, in the same order."""

from __future__ import annotations

import torch
from training_fixtures import tiny_config, write_walks

from recsys_alibi.training.datamodule import SequenceDataModule


def test_worker_processes_give_the_same_training_batches(tmp_path):
    prepared = write_walks(tmp_path / "prepared")
    epochs = []
    for workers in (0, 2):
        config = tiny_config(tmp_path, "train.packing=true", f"train.num_workers={workers}")
        datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
        loader = datamodule.train_dataloader()
        assert loader.num_workers == workers
        loader.sampler.set_epoch(1)
        epochs.append(list(loader))
    plain, parallel = epochs
    assert len(plain) == len(parallel) == 8  # 240 users, 32 a step
    for a, b in zip(plain, parallel, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
