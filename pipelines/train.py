"""``recsys-alibi train``: fit the ranker on a prepared directory inside an MLflow run.

The run holds the resolved config (params), a fingerprint of the prepared data, per-epoch
validation metrics, the best checkpoint's model (logged and registered) with its vocabulary.

Several processes (``train.devices``/``train.num_nodes``/``train.strategy``, torchrun, SLURM):
every process runs this job and trains; only global rank 0 opens the MLflow run, logs and
registers the model. The other ranks return a result with ``rank > 0`` and no run.

Resuming (``train.resume`` / ``--resume``, :mod:`pipelines.resume`): the newest unfinished
``<output>/checkpoints/<run_id>/last.ckpt`` trained on the data now is continued (on any number of
processes) inside the same MLflow run; unfinished checkpoints of other data are moved aside with one
line, and when none is left a new run starts. A checkpoint of another model (``model.*``) is refused
(ConfigError, one line).

One prepare throughout: the job reads the ``prepare_id`` of the prepared directory first and
every later read (the data module's, the vocabulary logged with the model) must be of that
prepare; a prepare that completes into the directory while training runs fails the job (DataError,
one line) before anything is logged as a model. ``evaluate.protocol=temporal`` on data whose time
came from line order is refused before training
(:func:`recsys_alibi.data.time_gaps.check_time_protocol`).

Warm start (``train.init_from``, :mod:`pipelines.init_from`): a new run starts from a logged model's
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

from pipelines.resume import DATA_TAG, SPLIT_TAG, check_same_model, choose_resume, data_differences, write_data_record
from recsys_alibi.config import ConfigError, JobConfig
from recsys_alibi.data.prepared import check_prepared, data_sha256
from recsys_alibi.data.sequences import read_items
from recsys_alibi.data.time_gaps import check_time_protocol
from recsys_alibi.tracking import LoggedModel, log_config, log_ranker, setup_tracking, tracking_uri
from recsys_alibi.training.data_rules import resolve_max_len
from recsys_alibi.training.datamodule import SequenceDataModule
from recsys_alibi.training.fit import check_sharding, fit_ranker
from recsys_alibi.training.launch import check_accelerator, launch_rank, mark_complete, resumable_checkpoint
from pipelines.init_from import WarmStart, data_counts, resolve_warm_start
from serving.pyfunc import pyfunc_flavour

log = logging.getLogger(__name__)



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
    prepare_id: str | None = None  # the prepare of the directory it trained on (None: no manifest)
    warm_start: WarmStart | None = None  # what train.init_from started from (None: from scratch, not asked)
    ungated: bool = False  # not trained now: an earlier pipeline's version of this data and config, never gated

    def summary(self) -> str:
        if self.rank != 0 or self.model is None:
            return ""
        if self.ungated:
            return (f"not trained again: version {self.model.version} (model runs:/{self.run_id}/model) was trained "
                    "and registered by an earlier pipeline run on this data with this config, which stopped before "
                    f"its gate; best validation NDCG@10 {self.best_val_ndcg_at_10:.4f}; gating it now")  # fmt: skip
        version = f", version {self.model.version}" if self.model.version else ""
        where = f" on {self.world_size} processes" if self.world_size > 1 else ""
        resumed = f" (resumed from {self.resumed_from})" if self.resumed_from else ""
        warm = f"\n{self.warm_start.line()}" if self.warm_start else ""
        return (
            f"trained {self.epochs} epoch{'' if self.epochs == 1 else 's'}{where} in {self.train_seconds:.0f} s{resumed}; best validation NDCG@10 "
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


def run_train(config: JobConfig, prepared_dir: str | Path, *, progress: bool = True, register: bool = True,
              champion=None, version_tags: dict[str, str] | None = None) -> TrainJobResult:  # fmt: skip
    """Train on ``prepared_dir`` and log everything to a new (or the resumed) MLflow run.

    ``champion``: the pipeline's pinned champion for ``train.init_from=champion``
    (:func:`pipelines.init_from.resolve_warm_start`). ``version_tags``: set on the registered version as soon as
    it is registered (the pipeline's ``promotion.decision=pending``, :func:`pipelines.promotion.pending_tags`).

    Call it on every training process; rank 0 does the tracking. ``model.max_len: auto`` is
    resolved from the data first (:func:`recsys_alibi.training.data_rules.resolve_max_len`).

    Raises:
        DataError: the prepared directory is missing or malformed, or prepared again while training ran.
        ValueError: ``evaluate.protocol=temporal`` on data whose time came from line order.
        ConfigError: ``model.shard_embeddings`` with the full softmax, an accelerator this machine lacks, the
            global batch does not divide over the processes, or the MLflow run of the checkpoint to resume is
            not in the store.
    """
    check_sharding(config)
    check_accelerator(config.train)
    prepared_dir = Path(prepared_dir)
    prepare_id = check_prepared(prepared_dir)  # every read of this job must be of this prepare
    check_time_protocol(prepared_dir, config.evaluate.protocol, prepare_id)
    config = resolve_max_len(config, prepared_dir, prepare_id)  # model.max_len: auto -> its number, logged as such
    datamodule = SequenceDataModule(
        prepared_dir, config.model, config.train, config.seed,
        protocol=config.evaluate.protocol, cutoff=config.evaluate.temporal_cutoff,
    )  # fmt: skip
    check_prepared(prepared_dir, prepare_id)  # the data module read this prepare too
    checkpoints = Path(config.output) / "checkpoints"
    rank = launch_rank(config.train.devices)
    resume = _resumable(config, checkpoints, datamodule, prepared_dir, rank) if config.train.resume else None
    config, warm = resolve_warm_start(config, prepared_dir, resume, champion)  # train.init_from, refused before training
    callbacks = training_callbacks(config) + (warm.callbacks() if warm else [])
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
        log.info("train.resume: no unfinished checkpoint of this data and split under %s; starting a new run", checkpoints)
    elif not config.train.resume and (unfinished := resumable_checkpoint(checkpoints)) is not None:
        log.info("an unfinished run is under %s (killed, or still running); --resume (train.resume=true) "
                 "continues it when it trained on this data; this run starts a new one", unfinished.parent)  # fmt: skip
    setup_tracking(config.tracking)
    return _train_and_track(config, prepared_dir, datamodule, checkpoints, resume, callbacks, warm, progress=progress,
                            register=register, version_tags=version_tags)  # fmt: skip


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
    version_tags: dict[str, str] | None = None,
) -> TrainJobResult:
    """Rank 0's part of ``run_train``: the MLflow run around ``fit_ranker``, then the model."""
    import mlflow
    from lightning.pytorch.loggers import MLFlowLogger

    resumed_run = resume.parent.name if resume else None
    fingerprint = data_sha256(prepared_dir, datamodule.prepare_id)
    if resumed_run is not None:
        try:
            before = mlflow.get_run(resumed_run).data
        except Exception as err:  # MlflowException: the run is not in this store
            raise ConfigError(
                f"cannot resume {resume}: MLflow run {resumed_run} is not in {tracking_uri(config.tracking)} "
                f"({str(err).splitlines()[0]}); use the same tracking store or remove that checkpoint directory"
            ) from None
        check_same_model(config, before.params, resume)
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
        if resume is None:
            write_data_record(checkpoint_dir, fingerprint, split_tag(datamodule))  # what --resume compares
        if warm is not None and resume is None:
            warm.write_marker(checkpoint_dir)  # a resume of this run keeps the warm schedule, loads no weights
        fit = fit_ranker(
            config, datamodule, checkpoint_dir, logger, callbacks=callbacks, progress=progress, resume_from=resume
        )
        _check_rank(0, fit.is_global_zero)
        items = read_items(prepared_dir, datamodule.prepare_id)  # DataError if prepared again: nothing logged
        mark_complete(checkpoint_dir)
        mlflow.log_metrics(
            {"best_val_ndcg_at_10": fit.best_val_ndcg_at_10, "train_seconds": fit.train_seconds,
             "train.world_size": float(fit.world_size)}
        )  # fmt: skip
        registered = config.tracking.registered_model if register else None
        pyfunc = pyfunc_flavour(fit.module.model, items, k=config.score.k, exclude_seen=config.score.exclude_seen)
        logged = log_ranker(fit.module.model, items, registered, Path(config.output) / "model" / run_id, pyfunc=pyfunc)
        if logged.version is not None and version_tags:  # at once: a run killed before its gate leaves it pending
            client = mlflow.MlflowClient()
            for key, value in version_tags.items():
                client.set_model_version_tag(registered, logged.version, key, value)
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
        prepare_id=datamodule.prepare_id,
    )


def _resumable(config: JobConfig, checkpoints: Path, datamodule: SequenceDataModule, prepared_dir: Path, rank: int):
    """The checkpoint ``--resume`` continues on this data (:func:`pipelines.resume.choose_resume`), or None."""

    def mlflow_differences(run_id: str) -> list[str]:
        import mlflow

        setup_tracking(config.tracking)
        try:
            before = mlflow.get_run(run_id).data
        except Exception:  # noqa: BLE001 - not in this store: refused with its own line when resumed
            return []
        return data_differences(before, data_fingerprint(datamodule), fingerprint, split_tag(datamodule))

    fingerprint = data_sha256(prepared_dir, datamodule.prepare_id)
    return choose_resume(checkpoints, fingerprint, split_tag(datamodule), rank=rank, mlflow_differences=mlflow_differences)
