"""Recipe values that follow from the data: ``model.max_len: auto``.

A recipe (``configs/movielens-1m.yaml``, ``configs/beauty.yaml``) is meant for a kind of log, not
one file, so its training window is a rule over the history lengths instead of a number:

    max_len = clamp(round50(quantile_q(m)), 50, model.max_len_cap)

where ``m`` (U,) are the users' fit lengths (the events training and validation may use under
``evaluate.protocol``: :func:`recsys_alibi.data.partition.read_fit_lengths`), ``q`` is
``model.max_len_quantile`` (default 0.75) and ``round50`` rounds to the nearest multiple of 50
items (so a few users more or less do not move the window). ``model.max_len_cap`` (default 200)
is where longer windows stopped paying on this CPU at an equal time budget (docs/results.md,
"Long histories"; ALiBi still scores longer histories whole, ``score.max_context``).

Measured values: ML-1M (SASRec file, 75 % quantile 206 events) -> 200; Amazon Beauty (S3-Rec
file, 75 % quantile 8) -> 50; MovieLens latest-small (167) -> 150. The resolved value is what
the MLflow run logs as ``model.max_len``, so the trained model and its scores never see ``auto``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from recsys_alibi.config import JobConfig, with_overrides
from recsys_alibi.data.partition import read_fit_cutoff, read_fit_lengths
from recsys_alibi.training.context_schedule import resolve_schedule

log = logging.getLogger(__name__)

MAX_LEN_STEP = 50  # items: max_len: auto is a multiple of this, and at least this


def max_len_from_lengths(fit_lengths: np.ndarray, quantile: float = 0.75, cap: int = 200) -> int:
    """The training window (items) that ``model.max_len: auto`` stands for.

    Args:
        fit_lengths: (U,) int, events per user that training may use (U >= 1).
        quantile: in (0, 1], e.g. 0.75 for the 75th percentile of the users' lengths.
        cap: the largest window returned, items (>= 2; below 50 it is returned as it is).

    Returns:
        ``min(cap, max(50, 50 * round(quantile_q(fit_lengths) / 50)))``.

    Raises:
        ValueError: no lengths.
    """
    lengths = np.asarray(fit_lengths)
    if lengths.size == 0:
        raise ValueError("model.max_len=auto needs at least one user history")
    q = float(np.quantile(lengths, quantile))
    return int(min(cap, max(MAX_LEN_STEP, MAX_LEN_STEP * round(q / MAX_LEN_STEP))))


def _fit_lengths(config: JobConfig, prepared_dir: str | Path, prepare_id: str | None) -> np.ndarray:
    """(U,) events per user that training may use under ``evaluate.protocol``."""
    ev = config.evaluate
    cutoff = read_fit_cutoff(prepared_dir, ev.protocol, ev.temporal_cutoff, prepare_id)
    return read_fit_lengths(prepared_dir, ev.protocol, cutoff, prepare_id)


def resolve_max_len(config: JobConfig, prepared_dir: str | Path, prepare_id: str | None = None) -> JobConfig:
    """``config`` with ``model.max_len: auto`` replaced by the value of its data (else unchanged).

    With ``train.context_schedule`` its ``"whole"`` windows become the longest fit history and
    ``model.max_len`` the last window (:func:`recsys_alibi.training.context_schedule.resolve_schedule`).

    Raises:
        DataError: the prepared directory cannot be read.
        ValueError: the directory holds no user.
    """
    model = config.model
    if config.train.context_schedule:  # its last window is the model's max_len ("whole": the longest history)
        return resolve_schedule(config, int(np.max(_fit_lengths(config, prepared_dir, prepare_id), initial=2)))
    if model.max_len != "auto":
        return config
    lengths = _fit_lengths(config, prepared_dir, prepare_id)
    max_len = max_len_from_lengths(lengths, model.max_len_quantile, model.max_len_cap)
    log.info(
        "model.max_len=auto: %d items (%g quantile of %d users' histories: %.0f events, rounded to %d, cap %d)",
        max_len, model.max_len_quantile, lengths.size, np.quantile(lengths, model.max_len_quantile),
        MAX_LEN_STEP, model.max_len_cap,
    )  # fmt: skip
    return with_overrides(config, model={"max_len": max_len})

