"""``train --resume``: which unfinished checkpoint a run continues, and when it starts a new run instead.

A run records what it trains on in ``<output>/checkpoints/<run_id>.data.json`` (the content
fingerprint of the prepared data and the split, as its MLflow tags ``recsys_alibi.data_sha256`` and
``recsys_alibi.train_split``) before its first epoch. ``--resume`` continues the newest unfinished
checkpoint (no ``COMPLETE`` marker) trained on the data now: the same fingerprint (a copy of the
directory or a re-prepare of the same events match) and the same split. Unfinished checkpoints of
other data (a nightly job killed once, then given new data) are moved aside, to
``<output>/checkpoints/stale/<run_id>/``, with one line saying so, and a new run starts: a
scheduler can always add ``--resume``. Every process decides alone from these files and gets the
same answer (moving a checkpoint of other data never changes it).

A checkpoint without that record (written before it existed) is compared on rank 0 with its
MLflow run (tags, and the ``data.*`` counts of users, items and training events); one of other
data is moved aside too. A checkpoint whose run trained another model (``model.*``) is refused:
that is a change of the job, not of its data (:func:`check_same_model`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from recsys_alibi.atomic import write_json_atomic
from recsys_alibi.config import ConfigError, JobConfig
from recsys_alibi.tracking import param_values
from recsys_alibi.training.launch import resumable_checkpoint

log = logging.getLogger(__name__)

DATA_TAG = "recsys_alibi.data_sha256"  # content fingerprint of the prepared data (sequences + vocabulary)
SPLIT_TAG = "recsys_alibi.train_split"  # "leave_one_out" or "temporal<cutoff"
DATA_RECORD = "data.json"  # checkpoints/<run_id>.data.json, beside the run's directory: {DATA_TAG: ..., SPLIT_TAG: ...}
STALE_DIR = "stale"  # checkpoints/stale/<run_id>: unfinished checkpoints of other data, moved aside
# model.* keys a resume may change: the backends compute the same function on the same state dict, and
# the max_len rule's inputs matter only through the max_len they resolve to (compared)
RESUME_FREE = ("model.attention_backend", "model.embedding_backend", "model.max_len_quantile", "model.max_len_cap")
# train.* keys that define what the checkpoint's optimiser and batches are: the checkpoint's state (its learning rate,
# moments, schedule) would be kept over a new value without a word; the others (epochs, minutes, processes, precision,
# validation, workers) may change on a resume
RESUME_BOUND_TRAIN = ("loss", "lr", "weight_decay", "warmup_steps", "grad_clip", "num_negatives", "gbce_t", "batch_size",
                      "packing", "windows", "batch_tokens", "context_schedule", "init_from", "warm")  # fmt: skip


def write_data_record(checkpoint_dir: Path, fingerprint: str, split: str) -> None:
    """Record the data a run trains on beside its checkpoint directory (atomically; before the first epoch)."""
    checkpoint_dir.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(_record_path(checkpoint_dir), {DATA_TAG: fingerprint, SPLIT_TAG: split})


def _record_path(checkpoint_dir: Path) -> Path:
    return checkpoint_dir.with_name(f"{checkpoint_dir.name}.{DATA_RECORD}")


def choose_resume(
    checkpoints: Path, fingerprint: str, split: str, *, rank: int, mlflow_differences: Callable[[str], list[str]]
) -> Path | None:
    """The ``last.ckpt`` to continue, or None for a new run; rank 0 moves checkpoints of other data aside.

    Args:
        checkpoints: ``<output>/checkpoints``.
        fingerprint: ``data_sha256`` of the prepared directory now.
        split: the split now (``leave_one_out`` or ``temporal<CUTOFF>``).
        rank: this process's global rank (only rank 0 moves directories and asks MLflow).
        mlflow_differences: run id -> what differs between that MLflow run's data and the data now
            (empty: the same); used for checkpoints without a record, on rank 0.
    """
    now = {DATA_TAG: fingerprint, SPLIT_TAG: split}

    def same_data(last: Path) -> bool:
        record = _read_record(last.parent)
        if record is None:
            return last.exists()  # decided below with the MLflow run (gone: rank 0 moved it aside meanwhile)
        if record != now and rank == 0:
            _move_aside(checkpoints, last.parent, _describe(record, now))
        return record == now

    while (last := resumable_checkpoint(checkpoints, keep=same_data)) is not None:
        if rank != 0 or _read_record(last.parent) is not None:
            return last
        differ = mlflow_differences(last.parent.name)
        if not differ:
            return last
        _move_aside(checkpoints, last.parent, ", ".join(differ))
    return None


def _read_record(checkpoint_dir: Path) -> dict | None:
    try:
        record = json.loads(_record_path(checkpoint_dir).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _describe(record: dict, now: dict) -> str:
    names = {DATA_TAG: "data sha256", SPLIT_TAG: "split"}
    return ", ".join(
        f"{names[key]} {str(record.get(key))[:12]} (now {value[:12]})" for key, value in now.items() if record.get(key) != value
    )


def _move_aside(checkpoints: Path, checkpoint_dir: Path, why: str) -> None:
    """``os.replace`` the run's checkpoint directory into ``checkpoints/stale/`` (atomic), with one line."""
    target = checkpoints / STALE_DIR / checkpoint_dir.name
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(checkpoint_dir, target)
    except FileNotFoundError:  # another process moved it first
        return
    if _record_path(checkpoint_dir).exists():
        os.replace(_record_path(checkpoint_dir), _record_path(target))
    log.warning(
        "train.resume: the unfinished run %s trained on other data (%s); its checkpoints are moved to %s and a new "
        "run starts", checkpoint_dir.name, why, target,
    )  # fmt: skip


def data_differences(before, counts: dict[str, float], fingerprint: str, split: str) -> list[str]:
    """What differs between the data of an MLflow run (its ``RunData``) and the data now (empty: nothing).

    Compared: the content fingerprint and the split (tags, when the run has them) and the counts
    of users, items and training events (metrics ``data.*``, logged by every run).
    """
    tags, metrics = before.tags, before.metrics
    differ = []
    if DATA_TAG in tags and tags[DATA_TAG] != fingerprint:
        differ.append(f"data sha256 {tags[DATA_TAG][:12]} (now {fingerprint[:12]})")
    if SPLIT_TAG in tags and tags[SPLIT_TAG] != split:
        differ.append(f"split {tags[SPLIT_TAG]} (now {split})")
    differ += [
        f"{key}={metrics[key]:.0f} (now {value:.0f})" for key, value in counts.items() if key in metrics and metrics[key] != value
    ]
    return differ


def check_same_model(config: JobConfig, logged: dict[str, str], resume: Path) -> None:
    """ConfigError when ``config.model``, or a ``train.*`` key of :data:`RESUME_BOUND_TRAIN`, differs from the run
    being resumed.

    ``logged``: that run's params (``log_config``); a key it lacks (a setting added since) is
    compared with its default. The checkpoint's weights only fit the model they came from, and its optimiser
    state (learning rate, moments, schedule) replaces a new learning rate or loss without a word.
    """
    def bound(tree: dict) -> dict:
        return {"model": tree["model"], "train": {key: tree["train"][key] for key in RESUME_BOUND_TRAIN}}

    defaults = param_values(bound(JobConfig().model_dump()))
    before = {key: logged.get(key, default) for key, default in defaults.items()}
    now = param_values(bound(config.model_dump()))
    differ = [
        f"{key}={before[key]} (now {value})"
        for key, value in now.items()
        if key not in RESUME_FREE and before[key] != value
    ]
    if differ:
        what = "another model" if any(key.startswith("model.") for key in (d.split("=")[0] for d in differ)) \
            else "with other training settings"  # fmt: skip
        raise ConfigError(
            f"cannot resume {resume}: its run trained {what} ({', '.join(differ)}); resume with the "
            "same model.* and train.* settings (epochs, minutes and processes may change), or remove that checkpoint "
            "directory to start a new run"
        )
