"""LightningDataModule over a prepared directory, under the evaluation protocol, one part per process.

Training and validation use only each user's fit prefix (:func:`recsys_alibi.data.splits.fit_split`):
leave-one-out trains on each user's events except the last two and validates on the second-last
from the events before it; temporal (``evaluate.protocol: temporal``) trains and validates only
on events before the cutoff. The test events are never seen during training or model choice.

Under data-parallel training (W processes) every rank reads only its own users
(:mod:`recsys_alibi.data.partition`): the constructor reads the ``length`` column (the
``timestamp`` column under the temporal protocol) and the vocabulary size, which are the same
on every rank; ``setup()`` (called by Lightning on each rank once the process group exists)
reads this rank's training and validation users. The
training batch ``train.batch_size`` is the global batch: each rank takes
``batch_size / W`` windows per step, so the steps per epoch and the learning-rate schedule do
not depend on W, and a checkpoint resumes on another number of processes. Each epoch shuffles
the rank's users with the seed ``(seed, epoch)``: a resumed run sees the same order as an
uninterrupted one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import lightning as L
import numpy as np
import polars as pl
import torch
from torch.utils.data import DataLoader, Sampler

from recsys_alibi.config import ConfigError, ModelConfig, TrainConfig
from recsys_alibi.data.buckets import LongestFirst, rank_buckets
from recsys_alibi.data.loader import (
    FlatSequences,
    HistoryTargets,
    NextItemWindows,
    collate_history_targets,
    collate_next_item,
    collate_packed_next_item,
)
from recsys_alibi.data.partition import (
    read_fit_cutoff,
    read_fit_lengths,
    read_sequence_rows,
    train_part,
    valid_part,
)
from recsys_alibi.data.prepare import read_items
from recsys_alibi.data.prepared import check_prepared
from recsys_alibi.data.schema import ITEM_IDX, LENGTH, TIMESTAMP, USER_ID
from recsys_alibi.data.splits import HISTORY_TIME_GAPS, MIN_FIT, Protocol, fit_split
from recsys_alibi.data.time_gaps import check_real_timestamps, with_time_gaps
from recsys_alibi.training.context_schedule import window_at

log = logging.getLogger(__name__)


def first_targets(examples: pl.DataFrame) -> np.ndarray:
    """(U,) int64: the first element of each user's ``targets`` list."""
    return examples.get_column("targets").list.first().to_numpy().astype(np.int64)


class EpochShuffle(Sampler[int]):
    """A permutation of ``range(n)`` drawn from ``(seed, epoch)``; Lightning calls ``set_epoch``.

    The order of an epoch depends on nothing else (not on the global RNG state), so a run
    resumed from a checkpoint shuffles exactly as the uninterrupted run.
    """

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return iter(np.random.default_rng([self.seed, self.epoch]).permutation(self.n).tolist())


class SequenceDataModule(L.LightningDataModule):
    """Batches of right-padded windows (train) and (history, target) pairs (validation).

    Args:
        prepared_dir: output of ``recsys-alibi prepare``.
        model_cfg: gives ``max_len`` (training window, items; validation's history cut).
        train_cfg: batch sizes (``batch_size`` is global, see the module doc), ``val_users``;
            ``context_schedule``, when set, gives each epoch's training window instead of
            ``model.max_len`` (``"whole"`` resolved first: ``data_rules.resolve_max_len``).
        seed: picks the fixed validation subset when ``val_users`` is set; shuffles each epoch.
        protocol: ``evaluate.protocol``; training and validation stay inside its fit prefix.
        cutoff: ``evaluate.temporal_cutoff`` (seconds; None: the default cutoff of the data).

    Attributes (set by the constructor): ``n_items`` N; ``n_train_users`` and
    ``n_train_events`` over all ranks; ``protocol`` and ``cutoff`` (resolved, temporal only);
    ``prepare_id`` of the directory (None without a manifest), which every later read checks.
    Set by ``setup()`` / ``load()``: ``rank``, ``world_size``, ``train_histories`` and ``valid_histories`` (this rank's
    :class:`FlatSequences`), ``valid_targets`` (U_r,) int64.

    Raises:
        DataError: the prepared directory is missing or malformed.
        ValueError: no user has enough events to train; ``model_cfg.max_len`` is still ``auto``.
    """

    def __init__(
        self,
        prepared_dir: str | Path,
        model_cfg: ModelConfig,
        train_cfg: TrainConfig,
        seed: int,
        *,
        protocol: Protocol = "leave_one_out",
        cutoff: int | None = None,
    ) -> None:
        super().__init__()
        if model_cfg.max_len == "auto":
            raise ValueError("model.max_len=auto: resolve it from the data first (recsys_alibi.training.data_rules.resolve_max_len)")
        self.prepared_dir = Path(prepared_dir)
        self.model_cfg = model_cfg
        self.train_cfg = train_cfg
        self.seed = seed
        self.protocol = protocol
        self.prepare_id = check_prepared(self.prepared_dir)  # every later read must see the same prepare
        pid = self.prepare_id
        self.cutoff = read_fit_cutoff(self.prepared_dir, protocol, cutoff, pid)
        fit = read_fit_lengths(self.prepared_dir, protocol, self.cutoff, pid)  # (U,) events training may use
        self.n_items = read_items(self.prepared_dir, pid).height
        self.train_rows = np.flatnonzero(fit >= MIN_FIT["train"])  # (R_train,) rows of sequences.parquet
        self.train_fit = fit[self.train_rows]  # (R_train,) their fit lengths: every rank plans every rank's batches
        if self.train_rows.size == 0:
            if protocol == "leave_one_out":
                raise ValueError("no user has 4 or more events: nothing to train on (leave-one-out holds out each "
                                 "user's last event for test and the one before for validation, and a training "
                                 "example needs two more); prepare a log with longer histories")  # fmt: skip
            raise ValueError(
                f"no user has 3 or more events before the temporal cutoff {self.cutoff}: nothing to train on "
                "(set a later evaluate.temporal_cutoff, or null for the 90% quantile of the timestamps)"
            )
        self.n_train_users = int(self.train_rows.size)
        self.n_train_events = int((fit[self.train_rows] - 1).sum())
        valid_rows = np.flatnonzero(fit >= MIN_FIT["valid"])
        if train_cfg.val_users is not None and valid_rows.size > train_cfg.val_users:
            # the same rows, in the same order, as ``DataFrame.sample(n, seed)`` on the split
            picked = pl.Series(np.arange(valid_rows.size)).sample(n=train_cfg.val_users, seed=seed).to_numpy()
            valid_rows = valid_rows[picked]
        self.valid_rows = valid_rows
        self.rank: int | None = None
        self.world_size: int | None = None
        self._window: int | None = None  # the training window of the last loader built

    def setup(self, stage: str | None = None) -> None:
        """Read this rank's part (rank and world size from the trainer; 0 and 1 without one)."""
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        self.load(rank, world)

    def load(self, rank: int = 0, world_size: int = 1) -> None:
        """Read the training and validation users of ``rank`` out of ``world_size`` (idempotent).

        Raises:
            ConfigError: ``train.batch_size`` is not divisible by ``world_size``, there are
                fewer validation users than processes, or ``train.windows`` is "all" with more
                than one process.
        """
        if (self.rank, self.world_size) == (rank, world_size):
            return
        if self.train_cfg.batch_size % world_size:
            raise ConfigError(
                f"train.batch_size={self.train_cfg.batch_size} is the global batch and must be divisible by "
                f"the {world_size} training processes"
            )
        if self.train_cfg.windows == "all" and world_size > 1:
            raise ConfigError(
                "train.windows=all gives each process a different number of windows (and of steps); "
                "use it with one training process"
            )
        if 0 < self.valid_rows.size < world_size:
            raise ConfigError(f"{self.valid_rows.size} validation users cannot be split over {world_size} processes")
        buckets = self.model_cfg.time_gap_buckets
        if buckets:
            try:
                check_real_timestamps(self.prepared_dir)
            except ValueError as err:
                raise ConfigError(str(err)) from None
        columns = [USER_ID, ITEM_IDX, LENGTH] + ([TIMESTAMP] if buckets or self.protocol == "temporal" else [])

        def split(rows: np.ndarray, stage: str) -> pl.DataFrame:
            frame = read_sequence_rows(self.prepared_dir, rows, columns, self.prepare_id)
            frame = with_time_gaps(frame, buckets) if buckets else frame
            return fit_split(frame, stage, self.protocol, self.cutoff)  # type: ignore[arg-type]

        def gaps_of(examples: pl.DataFrame) -> FlatSequences | None:
            return FlatSequences.from_series(examples.get_column(HISTORY_TIME_GAPS)) if buckets else None

        train = split(train_part(self.train_rows, rank, world_size), "train")
        self.train_histories = FlatSequences.from_series(train.get_column("history"))
        self.train_gaps = gaps_of(train)
        valid = split(valid_part(self.valid_rows, rank, world_size), "valid")
        self.valid_histories = FlatSequences.from_series(valid.get_column("history"))
        self.valid_gaps = gaps_of(valid)
        self.valid_targets = first_targets(valid)
        per_rank = len(self.train_histories)
        self._own_train = int(np.clip(self.train_rows.size - rank * per_rank, 0, per_rank))  # before the padding
        self.rank, self.world_size = rank, world_size

    def item_counts(self) -> torch.Tensor:
        """(N + 1,) int64 training-event counts per item over this rank's users (index 0 = padding).

        Wrap-around padding rows are not counted, so the sum over ranks is the global count.
        """
        if self.rank is None:
            self.load()
        own = self.train_histories.values[: self.train_histories.offsets[self._own_train]]
        counts = np.bincount(own, minlength=self.n_items + 1)
        return torch.from_numpy(counts.astype(np.int64))

    def per_rank_batch_size(self) -> int:
        """``train.batch_size / world_size`` windows per step on each rank."""
        return self.train_cfg.batch_size // (self.world_size or 1)

    def train_window(self) -> int:
        """The training window (items) of the trainer's current epoch: ``train.context_schedule``
        (:mod:`recsys_alibi.training.context_schedule`) or ``model.max_len``."""
        schedule = self.train_cfg.context_schedule
        if not schedule:
            return self.model_cfg.max_len
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        return window_at(schedule, epoch)

    def train_dataloader(self) -> DataLoader:
        window = self.train_window()
        if self.train_cfg.context_schedule and window != self._window:
            log.info("training windows of %d items from this epoch on (train.context_schedule)", window)
        self._window = window
        return self.train_loader(window)

    def train_loader(self, max_len: int) -> DataLoader:
        """Training batches of windows of up to ``max_len + 1`` events (this rank's users)."""
        if self.rank is None:
            self.load()
        dataset = NextItemWindows(self.train_histories, max_len, self.train_cfg.windows, gaps=self.train_gaps)
        collate = (
            partial(collate_packed_next_item, row_len=max_len)
            if self.train_cfg.packing
            else collate_next_item
        )
        workers = self.train_cfg.num_workers  # the batches do not depend on it: collating is deterministic
        loading = dict(collate_fn=collate, num_workers=workers, persistent_workers=workers > 0,
                       pin_memory=torch.cuda.is_available())  # fmt: skip
        if self.train_cfg.batch_tokens is not None:  # similar lengths together, a padded-token budget per batch
            lengths = dataset.ends - dataset.starts  # several ranks: as many batches on each (each step all-reduces)
            buckets = rank_buckets(lengths, self.train_fit, max_len, self.rank, self.world_size,
                                   self.train_cfg.batch_tokens, self.per_rank_batch_size(), self.seed)  # fmt: skip
            return DataLoader(dataset, batch_sampler=buckets, **loading)
        sampler = EpochShuffle(len(dataset), self.seed)
        return DataLoader(dataset, batch_size=self.per_rank_batch_size(), sampler=sampler, **loading)

    def val_dataloader(self) -> DataLoader:
        if self.rank is None:
            self.load()
        max_len = self.model_cfg.max_len
        dataset = HistoryTargets(self.valid_histories, self.valid_targets, max_len, gaps=self.valid_gaps)
        return DataLoader(dataset, batch_sampler=self.val_batches(dataset), collate_fn=collate_history_targets)

    def val_batches(self, dataset: HistoryTargets) -> LongestFirst:
        """Validation users longest first, at most ``train.val_batch_size`` a batch and, with
        ``train.batch_tokens`` set, at most that many padded events (the training budget; a
        validation batch holds no gradients, so it needs less memory than a training batch of
        the same size). Without it the users are only sorted (``val_batch_size x max_len``
        bounds a batch, as before). Sorting keeps long histories together: random batches
        padded every row to the batch's longest (docs/benchmarks.md, "Epoch cost")."""
        max_len = self.model_cfg.max_len
        rows = self.train_cfg.val_batch_size
        windows = np.minimum(self.valid_histories.lengths()[dataset.rows], max_len)  # (U_r,) model inputs
        budget = self.train_cfg.batch_tokens or rows * max_len
        return LongestFirst(windows, rows, budget)
