"""Fit a ranker with Lightning: checkpoint on validation NDCG@10, early stopping, best weights back.

The caller owns tracking: it passes a Lightning logger (MLflow in the jobs) or None.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from recsys_alibi.config import JobConfig
from recsys_alibi.training.datamodule import SequenceDataModule
from recsys_alibi.training.module import VAL_MONITOR, RankerModule

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FitResult:
    """A trained module with its best validation weights loaded, and how it got there."""

    module: RankerModule
    best_checkpoint: str
    best_val_ndcg_at_10: float
    epochs: int
    train_seconds: float


def fit_ranker(
    config: JobConfig,
    datamodule: SequenceDataModule,
    checkpoint_dir: Path,
    logger=None,
    callbacks: list[L.Callback] | None = None,
    progress: bool = True,
) -> FitResult:
    """Train ``AlibiRanker`` on ``datamodule`` under ``config.train``.

    The checkpoint with the highest validation NDCG@10 is kept in ``checkpoint_dir`` and its
    weights are loaded back before returning (the test split is never looked at).
    """
    L.seed_everything(config.seed, workers=True, verbose=False)
    torch.set_float32_matmul_precision("high")
    module = RankerModule(
        config.model, config.train, datamodule.n_items, datamodule.item_counts(), config.evaluate.exclude_seen
    )
    checkpoint = ModelCheckpoint(
        dirpath=checkpoint_dir, filename="best", monitor=VAL_MONITOR, mode="max", save_top_k=1, save_last=True
    )
    stopping = EarlyStopping(monitor=VAL_MONITOR, mode="max", patience=config.train.patience)
    train = config.train
    trainer = L.Trainer(
        max_epochs=train.max_epochs,
        accelerator=train.accelerator,
        devices=train.devices,
        num_nodes=train.num_nodes,
        strategy=train.strategy,
        precision=train.precision,
        gradient_clip_val=train.grad_clip,
        limit_train_batches=train.limit_train_batches,
        callbacks=[checkpoint, stopping, *(callbacks or [])],
        logger=logger if logger is not None else False,
        enable_progress_bar=progress,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=10,
        deterministic=False,
    )
    started = time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    seconds = time.perf_counter() - started
    best = checkpoint.best_model_path
    if best:
        state = torch.load(best, map_location="cpu", weights_only=False)["state_dict"]
        module.load_state_dict(state, strict=False)
    score = checkpoint.best_model_score
    return FitResult(
        module=module,
        best_checkpoint=best,
        best_val_ndcg_at_10=float(score) if score is not None else float("nan"),
        epochs=trainer.current_epoch,
        train_seconds=seconds,
    )
