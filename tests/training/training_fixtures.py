"""Tiny prepared data and configs for the multi-process training tests (CPU, seconds per run).

Users walk the catalog in steps of +1 with some noise, so a 1-layer D=16 model learns within a
few epochs and the validation metric is far from 0 (differences between runs are meaningful).
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import polars as pl

from recsys_alibi.config import JobConfig, load_config
from recsys_alibi.data import schema

N_USERS = 240
N_ITEMS = 40
ROW_GROUP = 32  # users per Parquet row group: several groups, so a rank can skip the others'


def write_walks(path: Path, n_users: int = N_USERS, n_items: int = N_ITEMS, seed: int = 0) -> Path:
    """A prepared dir: ``sequences.parquet`` (row groups of 32 users) and ``items.parquet``."""
    rng = np.random.default_rng(seed)
    histories = []
    for _ in range(n_users):
        n = int(rng.integers(3, 30))
        start = int(rng.integers(0, n_items))
        steps = np.where(rng.random(n) < 0.5, 1, rng.integers(2, n_items, n))
        histories.append(((start + np.cumsum(steps)) % n_items + 1).astype(np.int32))
    path.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(
        {
            schema.USER_ID: pl.Series(np.arange(n_users), dtype=pl.Int64),
            schema.ITEM_IDX: pl.Series([h.tolist() for h in histories], dtype=pl.List(pl.Int32)),
            schema.TIMESTAMP: pl.Series([list(range(len(h))) for h in histories], dtype=pl.List(pl.Int64)),
            schema.LENGTH: pl.Series([len(h) for h in histories], dtype=pl.Int32),
        }
    ).write_parquet(path / schema.SEQUENCES_FILE, row_group_size=ROW_GROUP)
    counts = np.bincount(np.concatenate(histories), minlength=n_items + 1)[1:]
    pl.DataFrame(
        {
            schema.ITEM_IDX: pl.Series(np.arange(1, n_items + 1), dtype=pl.Int32),
            schema.ITEM_ID: pl.Series(np.arange(1, n_items + 1) + 100, dtype=pl.Int64),
            schema.COUNT: pl.Series(counts, dtype=pl.Int64),
        }
    ).write_parquet(path / schema.ITEMS_FILE)
    return path


TINY = [
    "model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.max_len=16", "model.dropout=0.1",
    "model.attention_backend=sdpa", "train.max_epochs=3", "train.batch_size=32", "train.warmup_steps=2",
    "train.lr=0.01", "train.val_batch_size=64", "train.patience=10", "train.attention_health=false",
]  # fmt: skip
# configs/default.yaml reads the synthetic item table (data.item_features, model.item_features); data without one
NO_ITEM_TABLE = ["data.item_features={}", "model.item_features.enabled=false"]


def tiny_config(output: Path, *overrides: str) -> JobConfig:
    """``TINY`` with ``output`` and extra ``dotted.key=value`` overrides."""
    return load_config(None, [*TINY, f"output={output}", *overrides])


class Killed(Exception):
    """Stands for a kill: raised by ``KillAt`` at the start of an epoch."""


class KillAt(L.Callback):
    """Raises ``Killed`` when epoch ``epoch`` (0-based) starts.

    The ``last.ckpt`` of epoch ``epoch - 1`` is then the newest state on disk, as after a kill.
    """

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            raise Killed(f"killed at the start of epoch {self.epoch}")


def validate_initial(config: JobConfig, prepared: Path) -> dict[str, float]:
    """Validation metrics of the seed's initial weights, on ``config.train.devices`` processes."""
    from recsys_alibi.training.datamodule import SequenceDataModule
    from recsys_alibi.training.module import RankerModule

    L.seed_everything(config.seed, verbose=False)
    datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
    module = RankerModule(config.model, config.train, datamodule.n_items, seed=config.seed)
    train = config.train
    trainer = L.Trainer(
        accelerator=train.accelerator, devices=train.devices, strategy=train.strategy, logger=False,
        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
    )  # fmt: skip
    (metrics,) = trainer.validate(module, datamodule=datamodule, verbose=False)
    return {k: float(v) for k, v in metrics.items()}
