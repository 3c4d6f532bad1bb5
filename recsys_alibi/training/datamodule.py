"""LightningDataModule over a prepared directory, leave-one-out protocol.

Training histories are each user's events except the last two; validation ranks the second-last
event from the events before it (the test event is never seen during training or model choice).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import lightning as L
import numpy as np
import polars as pl
import torch
from torch.utils.data import DataLoader

from recsys_alibi.config import ModelConfig, TrainConfig
from recsys_alibi.data.loader import (
    FlatSequences,
    HistoryTargets,
    NextItemWindows,
    collate_history_targets,
    collate_next_item,
    collate_packed_next_item,
)
from recsys_alibi.data.prepare import read_items, read_sequences
from recsys_alibi.data.splits import leave_one_out


def first_targets(examples: pl.DataFrame) -> np.ndarray:
    """(U,) int64: the first element of each user's ``targets`` list."""
    return examples.get_column("targets").list.first().to_numpy().astype(np.int64)


class SequenceDataModule(L.LightningDataModule):
    """Batches of right-padded windows (train) and (history, target) pairs (validation).

    Args:
        prepared_dir: output of ``recsys-alibi prepare``.
        model_cfg: gives ``max_len`` (training window, items).
        train_cfg: batch sizes, ``val_users`` subset size.
        seed: picks the fixed validation subset when ``val_users`` is set.

    Raises:
        DataError: the prepared directory is missing or malformed (from ``read_sequences``).
        ValueError: no user has enough events to train.
    """

    def __init__(self, prepared_dir: str | Path, model_cfg: ModelConfig, train_cfg: TrainConfig, seed: int) -> None:
        super().__init__()
        self.prepared_dir = Path(prepared_dir)
        self.model_cfg = model_cfg
        self.train_cfg = train_cfg
        self.seed = seed
        sequences = read_sequences(self.prepared_dir)
        self.n_items = read_items(self.prepared_dir).height
        train = leave_one_out(sequences, "train")
        self.train_histories = FlatSequences.from_series(train.get_column("history"))
        if len(self.train_histories) == 0 or int(self.train_histories.lengths().max(initial=0)) < 2:
            raise ValueError("no user has 4 or more events: nothing to train on (lower data.min_events_per_user?)")
        valid = leave_one_out(sequences, "valid")
        if train_cfg.val_users is not None and valid.height > train_cfg.val_users:
            valid = valid.sample(n=train_cfg.val_users, seed=seed)
        self.valid_histories = FlatSequences.from_series(valid.get_column("history"))
        self.valid_targets = first_targets(valid)

    def item_counts(self) -> torch.Tensor:
        """(N + 1,) int64 training-event counts per item index (index 0 = padding, 0)."""
        counts = np.bincount(self.train_histories.values, minlength=self.n_items + 1)
        return torch.from_numpy(counts.astype(np.int64))

    def train_dataloader(self) -> DataLoader:
        dataset = NextItemWindows(self.train_histories, self.model_cfg.max_len)
        collate = (
            partial(collate_packed_next_item, row_len=self.model_cfg.max_len)
            if self.train_cfg.packing
            else collate_next_item
        )
        return DataLoader(dataset, batch_size=self.train_cfg.batch_size, shuffle=True, collate_fn=collate)

    def val_dataloader(self) -> DataLoader:
        max_len = self.model_cfg.max_len
        dataset = HistoryTargets(self.valid_histories, self.valid_targets, max_len)
        return DataLoader(dataset, batch_size=self.train_cfg.val_batch_size, collate_fn=collate_history_targets)
