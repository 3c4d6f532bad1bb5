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
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler

__all__ = ["LengthBuckets", "plan_batches"]

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
