"""``recsys-alibi train``: fit the ranker on a prepared directory inside an MLflow run.

The run holds the resolved config (params), a fingerprint of the prepared data, per-epoch
validation metrics, the best checkpoint's model (logged and registered) with its vocabulary.

Several processes (``train.devices``/``train.num_nodes``/``train.strategy``, torchrun, SLURM):
every process runs this job and trains; only global rank 0 opens the MLflow run, logs and
registers the model. The other ranks return a result with ``rank > 0`` and no run.

Resuming (``train.resume`` / ``--resume``): the newest unfinished
``<output>/checkpoints/<run_id>/last.ckpt`` is continued (on any number of processes) inside
the same MLflow run; when there is none a new run starts. It is refused (ConfigError, one line)
when the run trained another model (``model.*``) or on other data: another content fingerprint
of the prepared data (tag ``recsys_alibi.data_sha256``, the same for a copy of the directory),
another split (protocol and temporal cutoff, tag ``recsys_alibi.train_split``), or other counts of
users, items and training events (``data.*`` metrics; the only record of runs made before the tags).

Warm start (``train.init_from``, :mod:`pipelines.warm_start`): a new run starts from a logged model's
weights, items matched by raw id (:mod:`recsys_alibi.training.warm_start`), with the ``train.warm``
schedule; a model of another architecture is refused before training. The run is tagged
``lineage.init_from``, ``lineage.parent_run_id`` and the counts of new items, users and events. A
resumed warm run keeps its schedule and never loads the parent's weights over its checkpoint.

Training and validation follow ``evaluate.protocol``: under ``temporal`` they use only the events
before the cutoff (:func:`recsys_alibi.data.splits.fit_split`), so no test target is trained on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from recsys_alibi.config import ConfigError, JobConfig, ModelConfig
from recsys_alibi.data.prepare import read_items
from recsys_alibi.data.prepared import data_sha256
from recsys_alibi.tracking import LoggedModel, log_config, log_ranker, param_values, setup_tracking, tracking_uri
from recsys_alibi.training.data_rules import resolve_max_len
from recsys_alibi.training.datamodule import SequenceDataModule
from recsys_alibi.training.fit import check_sharding, fit_ranker
from recsys_alibi.training.launch import check_accelerator, launch_rank, mark_complete, resumable_checkpoint
from pipelines.warm_start import WarmStart, data_counts, resolve_warm_start
from serving.pyfunc import pyfunc_flavour

log = logging.getLogger(__name__)

DATA_TAG = "recsys_alibi.data_sha256"  # content fingerprint of the prepared data (sequences + vocabulary)
SPLIT_TAG = "recsys_alibi.train_split"  # "leave_one_out" or "temporal<cutoff"
# model.* keys a resume may change: the backends compute the same function on the same state dict, and
# the max_len rule's inputs matter only through the max_len they resolve to (compared)
RESUME_FREE = ("model.attention_backend", "model.embedding_backend", "model.max_len_quantile", "model.max_len_cap")


@dataclass(frozen=True)
class TrainJobResult:
    """What ``train`` produced: the MLflow run and model, and the training figures."""

    run_id: str  # "" on ranks other than 0
    model: LoggedModel | None  # None on ranks other than 0
    best_val_ndcg_at_10: float
    epochs: int
    train_seconds: float
    checkpoint: str
    rank: int = 0
    world_size: int = 1
    resumed_from: str | None = None  # the last.ckpt this run continued
    warm_start: WarmStart | None = None  # what train.init_from started from (None: from scratch, not asked)

    def summary(self) -> str:
        if self.rank != 0 or self.model is None:
            return ""
        version = f", version {self.model.version}" if self.model.version else ""
        where = f" on {self.world_size} processes" if self.world_size > 1 else ""
        resumed = f" (resumed from {self.resumed_from})" if self.resumed_from else ""
        warm = f"\n{self.warm_start.line()}" if self.warm_start else ""
        return (
            f"trained {self.epochs} epochs{where} in {self.train_seconds:.0f} s{resumed}; best validation NDCG@10 "
            f"{self.best_val_ndcg_at_10:.4f}; model runs:/{self.run_id}/model{version}{warm}"
        )


def data_fingerprint(datamodule: SequenceDataModule) -> dict[str, float]:
    """Row counts of what the model was trained on, over all ranks (logged as MLflow metrics)."""
    return {
        "data.users": float(datamodule.n_train_users),
        "data.items": float(datamodule.n_items),
        "data.train_events": float(datamodule.n_train_events),
    }


def split_tag(datamodule: SequenceDataModule) -> str:
    """What the model was trained on inside the data: ``leave_one_out`` or ``temporal<CUTOFF``."""
    return "leave_one_out" if datamodule.cutoff is None else f"temporal<{datamodule.cutoff}"


def training_callbacks(config: JobConfig) -> list:
    """Extra Lightning callbacks of the job: attention health for ALiBi models (when enabled)."""
    from recsys_alibi.training.attention_health import AttentionHealth

    if config.model.position == "alibi" and config.train.attention_health:
        return [AttentionHealth(zero_share_threshold=config.train.zero_share_threshold)]
    return []


def run_train(config: JobConfig, prepared_dir: str | Path, *, progress: bool = True, register: bool = True) -> TrainJobResult:
    """Train on ``prepared_dir`` and log everything to a new (or the resumed) MLflow run.

    Call it on every training process; rank 0 does the tracking. ``model.max_len: auto`` is
    resolved from the data first (:func:`recsys_alibi.training.data_rules.resolve_max_len`).

    Raises:
        DataError: the prepared directory is missing or malformed.
        ConfigError: ``model.shard_embeddings`` with the full softmax, an accelerator this machine lacks, the
            global batch does not divide over the processes, or the MLflow run of the checkpoint to resume is
            not in the store.
    """
    check_sharding(config)
    check_accelerator(config.train)
    prepared_dir = Path(prepared_dir)
    config = resolve_max_len(config, prepared_dir)  # model.max_len: auto -> its number, logged as such
    datamodule = SequenceDataModule(
        prepared_dir, config.model, config.train, config.seed,
        protocol=config.evaluate.protocol, cutoff=config.evaluate.temporal_cutoff,
    )  # fmt: skip
    checkpoints = Path(config.output) / "checkpoints"
    resume = resumable_checkpoint(checkpoints) if config.train.resume else None
    config, warm = resolve_warm_start(config, prepared_dir, resume)  # train.init_from, refused before training
    callbacks = training_callbacks(config) + (warm.callbacks() if warm else [])
    rank = launch_rank(config.train.devices)
    if rank != 0:  # the checkpoint directory is rank 0's (ModelCheckpoint broadcasts it)
        for name in ("recsys_alibi", "pipelines", "serving"):  # INFO lines come from rank 0 only
            logging.getLogger(name).setLevel(max(logging.getLogger(name).getEffectiveLevel(), logging.WARNING))
        fit = fit_ranker(
            config, datamodule, resume.parent if resume else checkpoints, None,
            callbacks=callbacks, progress=False, resume_from=resume,
        )  # fmt: skip
        _check_rank(rank, fit.is_global_zero)
        return TrainJobResult(
            run_id="", model=None, best_val_ndcg_at_10=fit.best_val_ndcg_at_10, epochs=fit.epochs,
            train_seconds=fit.train_seconds, checkpoint=fit.best_checkpoint, rank=rank, world_size=fit.world_size,
            resumed_from=str(resume) if resume else None,
        )  # fmt: skip
    if config.train.resume and resume is None:
        log.info("train.resume: no unfinished checkpoint under %s; starting a new run", checkpoints)
    setup_tracking(config.tracking)
    return _train_and_track(config, prepared_dir, datamodule, checkpoints, resume, callbacks, warm, progress=progress,
                            register=register)  # fmt: skip


def _check_rank(launch: int, is_global_zero: bool) -> None:
    """Raise when the rank read from the environment disagrees with Lightning's global rank."""
    if (launch == 0) != is_global_zero:
        raise RuntimeError(
            f"the launcher's environment gave rank {launch} but Lightning made this process "
            f"{'' if is_global_zero else 'not '}global rank 0; set RANK (or use torchrun/srun) so that "
            "exactly one process tracks the run"
        )


def _train_and_track(
    config: JobConfig,
    prepared_dir: Path,
    datamodule: SequenceDataModule,
    checkpoints: Path,
    resume: Path | None,
    callbacks: list,
    warm: WarmStart | None,
    *,
    progress: bool,
    register: bool,
) -> TrainJobResult:
    """Rank 0's part of ``run_train``: the MLflow run around ``fit_ranker``, then the model."""
    import mlflow
    from lightning.pytorch.loggers import MLFlowLogger

    resumed_run = resume.parent.name if resume else None
    fingerprint = data_sha256(prepared_dir)
    if resumed_run is not None:
        try:
            before = mlflow.get_run(resumed_run).data
        except Exception as err:  # MlflowException: the run is not in this store
            raise ConfigError(
                f"cannot resume {resume}: MLflow run {resumed_run} is not in {tracking_uri(config.tracking)} "
                f"({str(err).splitlines()[0]}); use the same tracking store or remove that checkpoint directory"
            ) from None
        _check_same_model(config, before.params, resume)
        _check_same_data(before, datamodule, fingerprint, resume)
        log.info("resuming MLflow run %s from %s", resumed_run, resume)
    with mlflow.start_run(run_id=resumed_run) as run:
        run_id = run.info.run_id
        if resume is None:
            log_config(config)
            mlflow.set_tags({
                "recsys_alibi.position": config.model.position, "recsys_alibi.prepared": str(prepared_dir),
                DATA_TAG: fingerprint, SPLIT_TAG: split_tag(datamodule), **data_counts(prepared_dir),
                **(warm.tags() if warm else {}),
            })  # fmt: skip
        else:
            mlflow.set_tags({"recsys_alibi.resumed_from": str(resume), "recsys_alibi.resumed_prepared": str(prepared_dir)})
        mlflow.log_metrics(data_fingerprint(datamodule))
        logger = MLFlowLogger(tracking_uri=tracking_uri(config.tracking), run_id=run_id)
        checkpoint_dir = checkpoints / run_id
        if warm is not None and resume is None:
            warm.write_marker(checkpoint_dir)  # a resume of this run keeps the warm schedule, loads no weights
        fit = fit_ranker(
            config, datamodule, checkpoint_dir, logger, callbacks=callbacks, progress=progress, resume_from=resume
        )
        _check_rank(0, fit.is_global_zero)
        mark_complete(checkpoint_dir)
        mlflow.log_metrics(
            {"best_val_ndcg_at_10": fit.best_val_ndcg_at_10, "train_seconds": fit.train_seconds,
             "train.world_size": float(fit.world_size)}
        )  # fmt: skip
        registered = config.tracking.registered_model if register else None
        items = read_items(prepared_dir)
        logged = log_ranker(fit.module.model, items, registered, Path(config.output) / "model" / run_id,
                            pyfunc=pyfunc_flavour(fit.module.model, items, k=config.score.k))  # fmt: skip
    return TrainJobResult(
        run_id=run_id,
        model=logged,
        best_val_ndcg_at_10=fit.best_val_ndcg_at_10,
        epochs=fit.epochs,
        train_seconds=fit.train_seconds,
        checkpoint=fit.best_checkpoint,
        world_size=fit.world_size,
        resumed_from=str(resume) if resume else None,
        warm_start=warm,
    )


def _check_same_model(config: JobConfig, logged: dict[str, str], resume: Path) -> None:
    """ConfigError when ``config.model`` differs from the model of the run being resumed.

    ``logged``: that run's params (``log_config``); a key it lacks (a setting added since) is
    compared with its default. The checkpoint's weights only fit the model they came from.
    """
    defaults = param_values({"model": ModelConfig().model_dump()})
    before = {key: logged.get(key, default) for key, default in defaults.items()}
    now = param_values({"model": config.model.model_dump()})
    differ = [
        f"{key}={before[key]} (now {value})"
        for key, value in now.items()
        if key not in RESUME_FREE and before[key] != value
    ]
    if differ:
        raise ConfigError(
            f"cannot resume {resume}: its run trained another model ({', '.join(differ)}); resume with the "
            "same model.* settings, or remove that checkpoint directory to start a new run"
        )


def _check_same_data(before, datamodule: SequenceDataModule, fingerprint: str, resume: Path) -> None:
    """ConfigError when the data of the resumed run (its MLflow ``RunData``) is not the data now.

    Compared: the content fingerprint and the split (tags, when the run has them) and the counts
    of users, items and training events (metrics ``data.*``, logged by every run).
    """
    tags, metrics = before.tags, before.metrics
    now_counts = data_fingerprint(datamodule)
    differ = []
    if DATA_TAG in tags and tags[DATA_TAG] != fingerprint:
        differ.append(f"data sha256 {tags[DATA_TAG][:12]} (now {fingerprint[:12]})")
    if SPLIT_TAG in tags and tags[SPLIT_TAG] != split_tag(datamodule):
        differ.append(f"split {tags[SPLIT_TAG]} (now {split_tag(datamodule)})")
    differ += [
        f"{key}={metrics[key]:.0f} (now {value:.0f})"
        for key, value in now_counts.items()
        if key in metrics and metrics[key] != value
    ]
    if differ:
        then = tags.get("recsys_alibi.prepared", "another directory")
        raise ConfigError(
            f"cannot resume {resume}: its run trained on other data ({then}: {', '.join(differ)}); resume with "
            f"the --prepared directory and evaluate.protocol of that run, or remove that checkpoint directory to start a new run"
        )
