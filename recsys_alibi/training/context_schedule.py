"""Short-to-long training: the training window grows between epochs (``train.context_schedule``).

Long-context language models are trained at a short window for most steps and at the long one
for the last (Xiong et al. 2023, "Effective Long-Context Scaling of Foundation Models"). With
ALiBi there is no position table to extend or interpolate, so the same model, optimizer and
learning-rate schedule simply go on with longer windows from a configured epoch:

    train:
      max_epochs: 30
      context_schedule: [[0, 200], [25, whole]]   # epochs 0..24 at 200 items, 25..29 at the whole history

Each ``[epoch, window]`` pair holds from that epoch (0-based, Lightning's ``current_epoch``) to the
next pair; ``window`` is ``model.max_len`` for those epochs' training windows (items), or
``"whole"``: the longest history training may use (fit lengths under ``evaluate.protocol``).
What it changes, and what it does not:

* The training batches: the datamodule builds its training loader with the epoch's window and
  Lightning rebuilds it every epoch (``reload_dataloaders_every_n_epochs=1``, set by
  :func:`recsys_alibi.training.fit.fit_ranker`), so a run resumed from a ``last.ckpt`` of any
  epoch trains with that epoch's window. ``train.windows``, ``train.packing`` (rows of the
  window) and ``train.batch_tokens`` apply to each window as they do to ``model.max_len``.
* Nothing else: one model, one optimizer, one learning-rate schedule over all epochs. Its
  length is the sum of every epoch's batches at that epoch's window (:func:`scheduled_steps`),
  so warm-up and cosine decay run on across the switch.
* ``model.max_len`` becomes the schedule's last window (:func:`resolve_schedule`, at train
  time): the MLflow run logs it, validation (every epoch, also before the switch, so the
  checkpoint choice and early stopping compare like with like) cuts histories to it, and the
  logged model carries it (learned positions: the table's size; ``free_head_scale=log_beyond``:
  the length its free heads are unscaled within). Test evaluation and scoring read whole
  histories as for any ALiBi model (up to ``score.max_context``).

Early stopping (``train.patience``) and ``train.max_minutes`` may end a run before a switch;
:func:`warn_unreached` says so at the end of the fit.
"""

from __future__ import annotations

import logging
from recsys_alibi.config import JobConfig, with_overrides

log = logging.getLogger(__name__)

WHOLE = "whole"


def window_at(schedule: list[list[int]], epoch: int) -> int:
    """The training window (items) of ``epoch`` (0-based) under a resolved schedule.

    Args:
        schedule: ``[[epoch, window], ...]`` as validated by ``TrainConfig`` (first epoch 0,
            ascending), with ``"whole"`` already replaced by a number (:func:`resolve_schedule`).

    Raises:
        ValueError: a window is still ``"whole"``.

    Example:
        >>> [window_at([[0, 200], [25, 1000]], e) for e in (0, 24, 25, 29)]
        [200, 200, 1000, 1000]
    """
    window = [w for start, w in schedule if start <= epoch][-1]
    if not isinstance(window, int):
        raise ValueError("train.context_schedule has 'whole': resolve it from the data first (resolve_schedule)")
    return window


def resolve_schedule(config: JobConfig, longest: int) -> JobConfig:
    """``config`` with ``"whole"`` windows replaced by ``longest`` and ``model.max_len`` set to the last window.

    Without a schedule ``config`` is returned unchanged. A ``model.max_len`` (number or ``auto``)
    other than the last window is replaced, with an INFO line saying so.

    Args:
        longest: the longest history training may use, events (>= 2 for a trainable history).
    """
    schedule = config.train.context_schedule
    if not schedule:
        return config
    resolved = [[start, max(2, longest) if window == WHOLE else window] for start, window in schedule]
    last = resolved[-1][1]
    if config.model.max_len != last:
        log.info(
            "train.context_schedule %s: model.max_len=%s replaced by the last window, %d items (the trained model's "
            "context)", resolved, config.model.max_len, last,
        )  # fmt: skip
    return with_overrides(config, model={"max_len": last}, train={"context_schedule": resolved})


def epoch_windows(schedule: list[list[int]], max_epochs: int) -> list[int]:
    """(max_epochs,) the training window of each epoch."""
    return [window_at(schedule, epoch) for epoch in range(max_epochs)]


def limited_batches(n_batches: int, limit: int | float | None) -> int:
    """Batches one epoch runs under ``train.limit_train_batches`` (Lightning's rule: a count or a fraction)."""
    if limit is None:
        return n_batches
    if isinstance(limit, int):
        return min(n_batches, limit)
    return int(n_batches * limit)


def scheduled_steps(trainer) -> int:
    """Optimizer steps of the whole fit: the length of the learning-rate schedule.

    Without a context schedule this is Lightning's ``trainer.estimated_stepping_batches``
    (epochs x batches of the first epoch). With one, each epoch counts the batches of its own
    window (``train.windows: all`` and ``train.batch_tokens`` give a window its own number of
    batches), as the datamodule builds them on this rank (``SequenceDataModule.train_loader``),
    each cut to ``train.limit_train_batches``.
    """
    datamodule = getattr(trainer, "datamodule", None)
    schedule = getattr(getattr(datamodule, "train_cfg", None), "context_schedule", None)
    if not schedule:
        return int(trainer.estimated_stepping_batches)
    windows = epoch_windows(schedule, trainer.max_epochs)
    limit = datamodule.train_cfg.limit_train_batches
    per_window = {w: limited_batches(len(datamodule.train_loader(w)), limit) for w in set(windows)}
    return sum(per_window[w] for w in windows)


def warn_unreached(schedule: list[list[int]] | None, epochs_run: int) -> None:
    """A WARNING when the fit stopped (early stopping, ``max_minutes``) before the schedule's last switch."""
    if schedule and epochs_run <= schedule[-1][0]:
        log.warning(
            "training stopped after %d epochs, before train.context_schedule switches to %s items at epoch %d "
            "(early stopping: train.patience; or train.max_minutes)", epochs_run, schedule[-1][1], schedule[-1][0],
        )  # fmt: skip
