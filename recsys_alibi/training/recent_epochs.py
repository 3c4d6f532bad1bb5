"""Warm epochs over the users whose histories changed since the parent model, plus a replayed sample of the others.

A warm-started run (``train.init_from``) starts from a model that has already been trained on every
event up to its own data's last timestamp. ``train.warm.replay`` (a share ``r >= 0``) makes each
warm epoch train on

* every user with an event after the parent's last timestamp (new users, and users with new
  events: the new period), and
* ``round(r * n_recent)`` of the other users (all of them when fewer), drawn again every epoch
  without replacement from ``np.random.default_rng([seed, epoch, 1])``: the replay of older data
  that continual training keeps so as not to forget it (Ibrahim et al. 2024, arXiv 2403.08763,
  "replay"; ADER, Mi et al., RecSys 2020, replays stored old sequences).

The draw depends on ``(seed, epoch)`` only, so a resumed run trains on the same users as an
uninterrupted one. Used by :class:`recsys_alibi.training.datamodule.SequenceDataModule`.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler


def epoch_users(recent: np.ndarray, replay: float, seed: int, epoch: int) -> np.ndarray:
    """The users one warm epoch trains on.

    Args:
        recent: (U,) bool, True for a user with an event after the parent's last timestamp.
        replay: share r >= 0 of older users per recent user.
        seed, epoch: the draw's seed (``seed``, ``epoch``).

    Returns:
        (S,) int64 ascending indices into ``recent``: every recent user plus
        ``min(round(r * n_recent), n_older)`` older ones.

    Raises:
        ValueError: ``replay`` is negative.

    >>> epoch_users(np.array([True, False, False, True, False]), 0.5, seed=1, epoch=0).size
    3
    """
    if replay < 0:
        raise ValueError(f"replay must be >= 0, got {replay}")
    recent = np.asarray(recent, dtype=bool)
    older = np.flatnonzero(~recent)
    count = min(int(round(replay * int(recent.sum()))), older.size)
    drawn = np.random.default_rng([seed, epoch, 1]).choice(older, size=count, replace=False)
    return np.sort(np.concatenate([np.flatnonzero(recent), drawn]).astype(np.int64))


class SubsetShuffle(Sampler[int]):
    """A permutation of ``indices`` drawn from ``(seed, epoch)`` (Lightning calls ``set_epoch``).

    Args:
        indices: (S,) int64 dataset indices of this epoch.
    """

    def __init__(self, indices: np.ndarray, seed: int) -> None:
        self.indices = np.asarray(indices, dtype=np.int64)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return int(self.indices.size)

    def __iter__(self) -> Iterator[int]:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.indices.size)
        return iter(self.indices[order].tolist())


class MappedBatches(Sampler[list[int]]):
    """A batch sampler over positions ``0..S-1`` of a subset, yielding dataset indices ``indices[p]``.

    Args:
        batches: a batch sampler over the subset (e.g. :class:`recsys_alibi.data.buckets.LengthBuckets`
            of ``lengths[indices]``); ``set_epoch`` is passed on.
        indices: (S,) int64 dataset indices.
    """

    def __init__(self, batches: Sampler[list[int]], indices: np.ndarray) -> None:
        self.batches = batches
        self.indices = np.asarray(indices, dtype=np.int64)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.batches, "set_epoch"):
            self.batches.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches:
            yield self.indices[np.asarray(batch, dtype=np.int64)].tolist()
