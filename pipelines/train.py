"""``recsys-alibi train``: fit the ranker on a prepared directory inside an MLflow run.

The run holds the resolved config (params), a fingerprint of the prepared data, per-epoch
validation metrics, the best checkpoint's model (logged and registered) with its vocabulary.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from recsys_alibi.config import JobConfig
from recsys_alibi.data.prepare import read_items
from recsys_alibi.tracking import LoggedModel, log_config, log_ranker, setup_tracking, tracking_uri
from recsys_alibi.training.datamodule import SequenceDataModule
from recsys_alibi.training.fit import fit_ranker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainJobResult:
    """What ``train`` produced: the MLflow run and model, and the training figures."""

    run_id: str
    model: LoggedModel
    best_val_ndcg_at_10: float
    epochs: int
    train_seconds: float
    checkpoint: str

    def summary(self) -> str:
        version = f", version {self.model.version}" if self.model.version else ""
        return (
            f"trained {self.epochs} epochs in {self.train_seconds:.0f} s; best validation NDCG@10 "
            f"{self.best_val_ndcg_at_10:.4f}; model runs:/{self.run_id}/model{version}"
        )


def data_fingerprint(datamodule: SequenceDataModule) -> dict[str, float]:
    """Row counts of what the model was trained on (logged as MLflow metrics)."""
    histories = datamodule.train_histories
    return {
        "data.users": float(len(histories)),
        "data.items": float(datamodule.n_items),
        "data.train_events": float(len(histories.values)),
    }


def training_callbacks(config: JobConfig) -> list:
    """Extra Lightning callbacks of the job: attention health for ALiBi models (when enabled)."""
    from recsys_alibi.training.attention_health import AttentionHealth

    if config.model.position == "alibi" and config.train.attention_health:
        return [AttentionHealth(zero_share_threshold=config.train.zero_share_threshold)]
    return []


def run_train(config: JobConfig, prepared_dir: str | Path, *, progress: bool = True, register: bool = True) -> TrainJobResult:
    """Train on ``prepared_dir`` and log everything to a new MLflow run.

    Raises:
        DataError: the prepared directory is missing or malformed.
    """
    import mlflow
    from lightning.pytorch.loggers import MLFlowLogger

    prepared_dir = Path(prepared_dir)
    datamodule = SequenceDataModule(prepared_dir, config.model, config.train, config.seed)
    setup_tracking(config.tracking)
    with mlflow.start_run() as run:
        run_id = run.info.run_id
        log_config(config)
        mlflow.log_metrics(data_fingerprint(datamodule))
        mlflow.set_tags({"recsys_alibi.position": config.model.position, "recsys_alibi.prepared": str(prepared_dir)})
        logger = MLFlowLogger(tracking_uri=tracking_uri(config.tracking), run_id=run_id)
        fit = fit_ranker(
            config, datamodule, Path(config.output) / "checkpoints" / run_id, logger,
            callbacks=training_callbacks(config), progress=progress,
        )
        mlflow.log_metrics({"best_val_ndcg_at_10": fit.best_val_ndcg_at_10, "train_seconds": fit.train_seconds})
        registered = config.tracking.registered_model if register else None
        logged = log_ranker(fit.module.model, read_items(prepared_dir), registered, Path(config.output) / "model" / run_id)
    return TrainJobResult(
        run_id=run_id,
        model=logged,
        best_val_ndcg_at_10=fit.best_val_ndcg_at_10,
        epochs=fit.epochs,
        train_seconds=fit.train_seconds,
        checkpoint=fit.best_checkpoint,
    )
