"""Length-bucketed training batches: windows of similar length share a batch under a token budget.

A padded batch costs ``rows x L_max`` tokens and ``rows x H x L_max^2`` attention scores, where
``L_max`` is its longest window. Drawn at random from histories of 20 to 3,000 events, almost
every batch holds one long window, so every batch pays for ``max_len``. Sorting windows by length
inside a shuffled pool and cutting the sorted pool into batches of at most ``batch_tokens``
padded tokens (``rows x L_max <= batch_tokens``) bounds each batch's activations by the token
budget and its attention by ``batch_tokens x L_max`` (the sum of its rows' squared lengths up
to the padding inside a bucket), whatever ``model.max_len`` is. The same rule is used by
fairseq and Hugging Face (``group_by_length``: "megabatches" of shuffled examples sorted by
length); the order of the batches is then shuffled again, so an epoch is not ordered by length.
One shared causal mask serves each batch: with right padding, padded keys never reach real
queries (``recsys_alibi.model.attention``).

Under data-parallel training every step all-reduces the gradients, so every rank must take the
same number of steps in an epoch, while the batch count under a token budget depends on the
rank's own lengths. :class:`EqualStepBuckets` plans the batches of every rank (from window
lengths every rank knows, :func:`rank_window_lengths`: no communication) and splits the rank's
own batches until it has as many as the rank with the most.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

from recsys_alibi.data.partition import train_part

__all__ = ["EqualStepBuckets", "LengthBuckets", "LongestFirst", "plan_batches", "rank_buckets", "rank_window_lengths"]

POOL_BATCHES = 50  # batches' worth of windows sorted together (a fairseq-style megabatch)


class LengthBuckets(Sampler[list[int]]):
    """A batch sampler: lists of window indices of similar length, at most ``batch_tokens`` padded tokens each.

    Args:
        lengths: (W,) int64 window lengths (events, including the last target).
        batch_tokens: padded-token budget per batch (``rows x longest``), >= 1; a window longer
            than the budget gets a batch of its own.
        max_rows: at most this many windows per batch (the configured ``train.batch_size``).
        seed: the order of epoch ``e`` depends on ``(seed, e)`` only (``set_epoch``), as
            :class:`recsys_alibi.training.datamodule.EpochShuffle`.

    Every index appears exactly once per epoch.

    Raises:
        ValueError: ``batch_tokens < 1`` or ``max_rows < 1``.

    Example:
        >>> sorted(sorted(b) for b in LengthBuckets(np.array([5, 100, 6, 99]), batch_tokens=200, max_rows=8, seed=0))
        [[0, 2], [1, 3]]
    """

    def __init__(self, lengths: np.ndarray, batch_tokens: int, max_rows: int, seed: int) -> None:
        if batch_tokens < 1 or max_rows < 1:
            raise ValueError(f"batch_tokens and max_rows must be >= 1, got {batch_tokens}, {max_rows}")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.batch_tokens = int(batch_tokens)
        self.max_rows = int(max_rows)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def batches(self, epoch: int) -> list[list[int]]:
        """The batches of one epoch, in the order they are served."""
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(self.lengths.shape[0])
        pool = POOL_BATCHES * self.max_rows
        out: list[list[int]] = []
        for p0 in range(0, order.shape[0], pool):
            chunk = order[p0 : p0 + pool]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]  # ascending length
            batch: list[int] = []
            longest = 0
            for i in chunk.tolist():
                length = int(self.lengths[i])
                if batch and (max(longest, length) * (len(batch) + 1) > self.batch_tokens or len(batch) == self.max_rows):
                    out.append(batch)
                    batch, longest = [], 0
                batch.append(i)
                longest = max(longest, length)
            if batch:
                out.append(batch)
        if len(out) > 1:
            out = [out[j] for j in rng.permutation(len(out))]
        return out

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches(self.epoch))

    def __len__(self) -> int:
        return len(self.batches(self.epoch))


class EqualStepBuckets(LengthBuckets):
    """:class:`LengthBuckets` of one rank that serves as many batches as the rank with the most.

    Every rank plans the batches of every rank (same lengths, seed and epoch everywhere, so the
    same plans; no communication) and takes the largest count K. Its own batches are those of
    ``LengthBuckets(every_rank[rank], ...)``; while there are fewer than K, the batch with the
    most windows is split in two halves in place (each half stays within the token budget), so
    every window is still served exactly once per epoch. Only when every batch holds a single
    window are the first batches served again (as ``train_part`` pads the users by wrapping around).

    Args:
        every_rank: per rank, (W_r,) int64 window lengths in the order of that rank's dataset
            (:func:`rank_window_lengths`).
        rank: this process's rank, an index into ``every_rank``.
        batch_tokens, max_rows, seed: as :class:`LengthBuckets` (``max_rows`` per rank).

    Raises:
        ValueError: ``rank`` outside ``every_rank``; a budget below 1.

    Example:
        >>> ranks = [np.array([5, 5, 5, 5]), np.array([5, 50, 5, 50])]
        >>> [len(EqualStepBuckets(ranks, r, batch_tokens=100, max_rows=8, seed=0)) for r in range(2)]
        [2, 2]
    """

    def __init__(self, every_rank: Sequence[np.ndarray], rank: int, batch_tokens: int, max_rows: int, seed: int) -> None:
        if not 0 <= rank < len(every_rank):
            raise ValueError(f"rank {rank} outside the {len(every_rank)} ranks")
        super().__init__(every_rank[rank], batch_tokens, max_rows, seed)
        self.every_rank = [LengthBuckets(lengths, batch_tokens, max_rows, seed) for lengths in every_rank]
        self.rank = rank
        self._planned: tuple[int, list[list[int]]] | None = None  # (epoch, batches): __len__ and __iter__ agree

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of epoch ``epoch``: as many as the rank with the most."""
        if self._planned is not None and self._planned[0] == epoch:
            return self._planned[1]
        counts = [len(sampler.batches(epoch)) for sampler in self.every_rank]
        out = split_to_count(super().batches(epoch), max(counts))
        self._planned = (epoch, out)
        return out


def split_to_count(batches: list[list[int]], count: int) -> list[list[int]]:
    """``batches`` cut to ``count`` batches: the one with the most rows halved in place, repeatedly.

    A batch of one row cannot be split: when every batch is one row, the first ones are repeated.

    Example:
        >>> split_to_count([[1], [2, 3, 4, 5], [6, 7]], 5)
        [[1], [2], [3], [4, 5], [6, 7]]
    """
    out = list(batches)
    while out and len(out) < count:
        j = max(range(len(out)), key=lambda i: len(out[i]))  # the first of the largest
        if len(out[j]) < 2:
            out += [out[i % len(batches)] for i in range(count - len(out))]
            break
        half = len(out[j]) // 2
        out[j : j + 1] = [out[j][:half], out[j][half:]]
    return out


def rank_window_lengths(fit_lengths: np.ndarray, max_len: int, world_size: int) -> list[np.ndarray]:
    """Per rank, the lengths of its training windows under ``train.windows=last``.

    Each training user (fit prefix of ``m >= 3`` events) gives one window of its last
    ``min(m - 1, max_len + 1)`` training events (history ``m - 1``,
    :func:`recsys_alibi.data.splits.fit_split`; :class:`recsys_alibi.data.loader.NextItemWindows`),
    and rank ``r`` holds the users of :func:`recsys_alibi.data.partition.train_part`.

    Args:
        fit_lengths: (R,) int fit-prefix lengths of the training users, in row order (every rank reads them).
        max_len: ``model.max_len``.
        world_size: the number of training processes.

    Returns:
        ``world_size`` arrays of int64 window lengths, each in its rank's dataset order.
    """
    windows = np.minimum(np.asarray(fit_lengths, dtype=np.int64) - 1, max_len + 1)
    return [train_part(windows, rank, world_size) for rank in range(world_size)]


def rank_buckets(
    lengths: np.ndarray, fit_lengths: np.ndarray, max_len: int, rank: int, world_size: int,
    batch_tokens: int, max_rows: int, seed: int,
) -> LengthBuckets:
    """The batch sampler of rank ``rank`` of ``world_size`` under a token budget (``train.batch_tokens``).

    One process: :class:`LengthBuckets` over ``lengths``. Several: :class:`EqualStepBuckets` over
    every rank's window lengths (:func:`rank_window_lengths`), so every rank takes the same
    number of steps.

    Args:
        lengths: (W,) int64 window lengths of this rank's dataset, in its order.
        fit_lengths, max_len: as :func:`rank_window_lengths` (the window of this epoch).
        rank, world_size: this process and the number of training processes.
        batch_tokens, max_rows, seed: as :class:`LengthBuckets` (``max_rows`` per rank).

    Raises:
        RuntimeError: the planned lengths of this rank are not its dataset's (the ranks could not
            agree on their step count; a bug, not a user error).
    """  # fmt: skip
    if world_size == 1:
        return LengthBuckets(lengths, batch_tokens, max_rows, seed)
    every_rank = rank_window_lengths(fit_lengths, max_len, world_size)
    if not np.array_equal(every_rank[rank], lengths):
        raise RuntimeError(f"rank {rank}: the planned window lengths differ from the dataset's; steps would differ")
    return EqualStepBuckets(every_rank, rank, batch_tokens, max_rows, seed)


class LongestFirst(Sampler[list[int]]):
    """A batch sampler for scoring passes (validation): indices sorted by length, longest first,
    cut by :func:`plan_batches` into batches of at most ``max_rows`` rows and ``max_tokens``
    padded tokens (``rows x longest``).

    A batch of rows drawn at random is padded to its longest: on ML-1M validation at the whole
    history (2,000 users, 327,789 events) batches of 256 random users padded 2.8 M tokens and
    computed 4.3e9 attention pairs; sorted, the same users take 0.39 M tokens and 2.1e8 pairs.
    A row's output does not depend on the rows beside it (right padding, causal attention), so
    only the order of the rows changes. The order is fixed (no shuffling): the same every epoch.

    Args:
        lengths: (W,) int lengths (the padded width each index needs).
        max_rows, max_tokens: the two budgets, >= 1.

    Raises:
        ValueError: a budget below 1.

    Example:
        >>> list(LongestFirst(np.array([2, 5, 1, 2]), max_rows=8, max_tokens=5))
        [[1], [0, 3], [2]]
    """

    def __init__(self, lengths: np.ndarray, max_rows: int, max_tokens: int) -> None:
        if max_rows < 1 or max_tokens < 1:
            raise ValueError(f"max_rows and max_tokens must be >= 1, got {max_rows}, {max_tokens}")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        order = np.argsort(-self.lengths, kind="stable")  # longest first, ties in index order
        self._batches = [order[a:b].tolist() for a, b in plan_batches(self.lengths[order], max_rows, max_tokens)]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches)

    def __len__(self) -> int:
        return len(self._batches)


def plan_batches(lengths: np.ndarray, max_users: int, max_tokens: int) -> Iterator[tuple[int, int]]:
    """Cut users already sorted by length (either order) into ``[start, end)`` batches.

    A batch holds at most ``max_users`` users and ``users x longest <= max_tokens`` padded events
    (a single user longer than ``max_tokens`` gets a batch of its own). Used by batch scoring
    (``serving.rank``, ascending) and evaluation (``recsys_alibi.evaluation.evaluator``, descending).

    Args:
        lengths: (U,) int events per user (the context each is scored with), sorted.
        max_users, max_tokens: the two budgets, >= 1.

    Example:
        >>> list(plan_batches(np.array([5, 2, 2, 1]), max_users=8, max_tokens=4))
        [(0, 1), (1, 3), (3, 4)]
    """
    n = lengths.shape[0]
    start = 0
    while start < n:
        end, longest = start + 1, int(lengths[start])
        while end < n and end - start < max_users and (end - start + 1) * max(longest, int(lengths[end])) <= max_tokens:
            longest = max(longest, int(lengths[end]))
            end += 1
        yield start, end
        start = end
