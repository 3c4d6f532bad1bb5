"""Fit a ranker with Lightning: checkpoint on validation NDCG@10, early stopping, best weights back.

The caller owns tracking: it passes a Lightning logger (MLflow in the jobs) or None.

One process or several: ``train.devices``, ``train.num_nodes`` and ``train.strategy`` go to the
Lightning trainer as they are (``devices=2, strategy="ddp"`` on CPU runs two gloo processes;
under torchrun or SLURM Lightning reads the ranks from the environment). Each rank reads its own
users (``SequenceDataModule``), so Lightning's ``DistributedSampler`` is switched off.
Checkpoints hold a plain (unsharded) state dict, so ``resume_from`` may be a checkpoint written
with another number of processes; ``docs/scaling.md`` has the recipes. With
``model.shard_embeddings=true`` the item table is sharded row-wise over the processes
(``RankerModule.configure_model``); its checkpoints are gathered into the same layout.

Progress: Lightning's (rich) progress bar on a terminal; when standard output is not one (a log
file, a pipe, a scheduler) the bar is off and :class:`EpochLines` logs one line per epoch with the
bar's metrics instead of the bar's final frame, whose metrics wrap over several lines there.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerStatus

from recsys_alibi.config import ConfigError, JobConfig
from recsys_alibi.training.context_schedule import warn_unreached
from recsys_alibi.training.datamodule import SequenceDataModule
from recsys_alibi.training.launch import check_accelerator, resolve_precision
from recsys_alibi.training.module import VAL_MONITOR, RankerModule
from recsys_alibi.training.sharding import ROW_LOOKUP_LOSSES

log = logging.getLogger(__name__)

SHARDING_NEEDS_SAMPLED_LOSS = (
    "model.shard_embeddings=true needs train.loss=sampled_softmax, bce or gbce (got {loss}): the row-wise sharded "
    "item table gives each rank only its own rows, so training looks up the rows of the targets and sampled "
    "negatives, while the full softmax scores every position against the whole table "
    "(docs/scaling.md, 'Sharded item table')"
)


@dataclass(frozen=True)
class FitResult:
    """A trained module with its best validation weights loaded, and how it got there."""

    module: RankerModule
    best_checkpoint: str
    best_val_ndcg_at_10: float
    epochs: int
    train_seconds: float
    val_metrics: dict[str, float]  # the last validation (all ranks together)
    world_size: int = 1
    is_global_zero: bool = True


def fit_ranker(
    config: JobConfig,
    datamodule: SequenceDataModule,
    checkpoint_dir: Path,
    logger=None,
    callbacks: list[L.Callback] | None = None,
    progress: bool = True,
    resume_from: str | Path | None = None,
) -> FitResult:
    """Train ``AlibiRanker`` on ``datamodule`` under ``config.train``.

    The checkpoint with the highest validation NDCG@10 is kept in ``checkpoint_dir`` (with
    ``last.ckpt``, the state to resume from) and its weights are loaded back before returning on
    global rank 0 (the test split is never looked at). Call it on every rank.

    Args:
        resume_from: a ``last.ckpt`` to continue from (epoch, optimiser, schedule, callbacks);
            it may come from a run with another number of processes.

    Returns:
        On global rank 0 the module holds the best weights in an unsharded ``AlibiRanker``
        (also after sharded training); on other ranks the module as trained.

    Raises:
        ConfigError: ``model.shard_embeddings`` with a loss over the whole table (``check_sharding``);
            an accelerator this machine does not have (``check_accelerator``).
    """
    check_sharding(config)
    check_accelerator(config.train)
    L.seed_everything(config.seed, workers=True, verbose=False)
    torch.set_float32_matmul_precision("high")
    module = RankerModule(
        config.model, config.train, datamodule.n_items, None, config.evaluate.exclude_seen, seed=config.seed,
        catalog=catalog_of(config, datamodule),
    )
    bar, lines = show_progress(progress)
    checkpoint = ModelCheckpoint(dirpath=checkpoint_dir, filename="best", monitor=VAL_MONITOR, mode="max", save_top_k=1)
    # last.ckpt after every epoch (save_last=True would rewrite it only when "best" improves)
    latest = ModelCheckpoint(dirpath=checkpoint_dir, filename="last", monitor=None, save_top_k=1, enable_version_counter=False)
    stopping = EarlyStopping(monitor=VAL_MONITOR, mode="max", patience=config.train.patience)
    train = config.train
    clock = TrainClock()
    trainer = L.Trainer(
        max_epochs=train.max_epochs,
        max_time=timedelta(minutes=train.max_minutes) if train.max_minutes else None,
        accelerator=train.accelerator,
        devices=train.devices,
        num_nodes=train.num_nodes,
        strategy=train.strategy,
        precision=resolve_precision(train),
        gradient_clip_val=train.grad_clip,
        limit_train_batches=train.limit_train_batches,
        callbacks=[checkpoint, latest, stopping, clock, *lines, *(callbacks or [])],
        logger=logger if logger is not None else False,
        enable_progress_bar=bar,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=10,
        deterministic=False,
        use_distributed_sampler=False,  # each rank already reads only its own users
        # train.context_schedule: each epoch's loader is built with that epoch's window (also after a resume)
        reload_dataloaders_every_n_epochs=1 if train.context_schedule else 0,
    )
    with _process_group_released(), warnings.catch_warnings():
        if resume_from:  # the run's own checkpoints are there: expected
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from else None)
        except SystemExit:  # Lightning ends a fit stopped by SIGTERM with exit 0, by Ctrl-C with exit 1, both silent
            if trainer.state.status != TrainerStatus.INTERRUPTED:
                raise
            signal_name, code = ("SIGTERM", 143) if trainer.received_sigterm else ("Ctrl-C (SIGINT)", 130)
            how = "same command" if train.resume else "same command with --resume (train.resume=true)"
            log.error("error: training stopped by %s in epoch %d: nothing was evaluated, registered or scored; the "
                      "%s continues from %s", signal_name, trainer.current_epoch, how,
                      checkpoint_dir / "last.ckpt")  # fmt: skip
            raise SystemExit(code) from None
    seconds = clock.total()
    warn_unreached(train.context_schedule, trainer.current_epoch)
    best = checkpoint.best_model_path
    if best and trainer.is_global_zero:
        state = torch.load(best, map_location="cpu", weights_only=False)["state_dict"]
        if module.table is not None:  # the checkpoint holds the whole table: load it unsharded
            module = RankerModule(
                config.model, config.train, datamodule.n_items, None, config.evaluate.exclude_seen, seed=config.seed
            )
        module.load_state_dict(state, strict=False)
    score = checkpoint.best_model_score
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    return FitResult(
        module=module,
        best_checkpoint=best,
        best_val_ndcg_at_10=float(score) if score is not None else float("nan"),
        epochs=trainer.current_epoch,
        train_seconds=seconds,
        val_metrics=metrics,
        world_size=trainer.world_size,
        is_global_zero=trainer.is_global_zero,
    )


class TrainClock(L.Callback):
    """Wall seconds of ``trainer.fit`` summed over a run's resumes: the seconds before the resume are kept in each
    checkpoint (``state_dict``) and read back with it, so a resumed run reports its whole training time, not only
    the part after its last kill (the work between the last checkpoint and the kill, done again, counts once)."""

    def __init__(self) -> None:
        self.before = 0.0  # seconds of the earlier fits of this run (from the checkpoint resumed)
        self.started: float | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        self.started = time.perf_counter()

    def total(self) -> float:
        """Seconds so far: the earlier fits' plus this one's."""
        return self.before + (0.0 if self.started is None else time.perf_counter() - self.started)

    def state_dict(self) -> dict:
        return {"seconds": self.total()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.before = float(state_dict.get("seconds", 0.0))


def catalog_of(config: JobConfig, datamodule: SequenceDataModule):
    """The catalog's item features when ``model.item_features.enabled`` (read from the prepared directory
    of the data module, same prepare), else None.

    Raises:
        DataError: the prepared directory has no item table (prepare it with ``--items``), or its table has no
            row for any item of the events (the encoder would read nothing).
    """
    if not config.model.item_features.enabled:
        return None
    from recsys_alibi.data.errors import DataError
    from recsys_alibi.data.feature_rows import catalog_features

    catalog = catalog_features(datamodule.prepared_dir, datamodule.n_items, datamodule.prepare_id)
    if not catalog.with_row[1:].any():  # (N + 1,): row 0 is padding
        raise DataError(
            f"{datamodule.prepared_dir}: its item table has no row for any of the {datamodule.n_items} items of the "
            "events, so the feature encoder would read nothing: check the table's ids (data.item_features.id_column) "
            "against the events', or set model.item_features.enabled=false"
        )
    return catalog


class EpochLines(L.Callback):
    """Logs one INFO line per finished epoch (global rank 0): its number, the progress bar's
    metrics (``train/loss`` of the last step, the validation metrics) and its wall time.

    Example line: ``epoch 2/3: train/loss 3.6770, val/hr_at_10 0.3750, val/mrr 0.1900, val/ndcg_at_10 0.2180 (0.8 s)``.
    """

    def __init__(self) -> None:
        self.started = time.perf_counter()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.started = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:  # after validation
        if not trainer.is_global_zero:
            return
        metrics = ", ".join(f"{name} {float(value):.4f}" for name, value in sorted(trainer.progress_bar_metrics.items()))
        log.info("epoch %d/%d: %s (%.1f s)", trainer.current_epoch + 1, trainer.max_epochs, metrics or "no metrics",
                 time.perf_counter() - self.started)  # fmt: skip


def show_progress(progress: bool, stream=None) -> tuple[bool, list[L.Callback]]:
    """``(progress bar on, extra callbacks)``: the bar when ``progress`` and ``stream`` (default
    ``sys.stdout``, where the bar draws) is a terminal; one log line per epoch (:class:`EpochLines`)
    when ``progress`` and it is not; neither without ``progress`` (``--quiet``)."""
    stream = sys.stdout if stream is None else stream
    if not progress:
        return False, []
    if getattr(stream, "isatty", lambda: False)():
        return True, []
    return False, [EpochLines()]


LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


@contextmanager
def _process_group_released() -> Iterator[None]:
    """Leave the process as it was: no process group or launcher variables left behind by the fit.

    After a multi-process fit, rank 0 of the pipeline goes on alone (evaluate, score); a
    leftover group or ``WORLD_SIZE`` would make the scoring job wait for ranks that have exited.
    A group that existed before (torchrun script, test harness) is left alone.
    """
    import torch.distributed as dist

    had_group = dist.is_available() and dist.is_initialized()
    env_before = {key: os.environ.get(key) for key in LAUNCH_ENV}
    try:
        yield
    finally:
        if not had_group and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        if not had_group:
            for key, value in env_before.items():
                if value is None:
                    os.environ.pop(key, None)


def check_sharding(config: JobConfig) -> None:
    """Refuse a sharded item table with a loss that needs the whole table (docs/scaling.md).

    ``model.shard_embeddings=true`` shards the table row-wise over the training processes (one
    process: not sharded). Training then only looks up rows, so the loss must be one over sampled
    candidates (``sharding.ROW_LOOKUP_LOSSES``).

    Raises:
        ConfigError: ``model.shard_embeddings`` is true and ``train.loss`` is ``softmax``.
    """
    if config.model.shard_embeddings and config.train.loss not in ROW_LOOKUP_LOSSES:
        raise ConfigError(SHARDING_NEEDS_SAMPLED_LOSS.format(loss=config.train.loss))
