"""Non-learned baselines that implement the evaluator's ``Scorer`` protocol.

``PopularityScorer`` ranks every user's catalog by how often each item occurs in the training
events: the same list for everyone, minus the user's seen items (masked by the evaluator).
Items with equal counts are common (the long tail); by default they are put in a strict order
so that the scores are distinct and the optimistic tie rule of ``ranking.target_ranks`` cannot
flatter the baseline. That order uses training information only: the item whose last training
event is more recent first (given timestamps), then the raw item id (given the vocabulary's
ids), then a fixed hash of the index. Never the item index itself: ``prepare`` numbers items by
their count over *all* events, held-out targets included, so "lower index first" would favour
the test items.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import polars as pl
import torch

from recsys_alibi.data import schema

__all__ = ["BASELINES", "PopularityScorer", "tie_order"]


def _flat_times(train_histories: Any) -> np.ndarray | None:
    """The ``timestamp`` lists of a training DataFrame as one int64 array (None without them)."""
    if not isinstance(train_histories, pl.DataFrame) or schema.TIMESTAMP not in train_histories.columns:
        return None
    return _flat_items(train_histories[schema.TIMESTAMP])


def _index_hash(n: int) -> np.ndarray:
    """(n,) uint64 splitmix64 of 0..n-1: a fixed order that owes nothing to how indices were assigned."""
    z = np.arange(n, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def tie_order(counts: np.ndarray, last_seen: np.ndarray | None, item_ids: pl.Series | None) -> np.ndarray:
    """Item indices 1..N from most to least popular, ties broken by training information only.

    Args:
        counts: (N + 1,) int64 training counts (entry 0 = padding).
        last_seen: (N + 1,) float64 time of each item's last training event (-inf: none), or None.
        item_ids: (N,) raw ids of items 1..N, or None.

    Returns:
        (N,) int64: count descending, then ``last_seen`` descending, then raw id ascending, then
        the fixed index hash.
    """
    n = counts.shape[0]
    keys = [_index_hash(n)]
    if item_ids is not None:
        if item_ids.len() != n - 1:
            raise ValueError(f"item_ids must hold the raw ids of the {n - 1} items, got {item_ids.len()}")
        rank = item_ids.rank("ordinal").cast(pl.Int64).to_numpy()
        keys.append(np.concatenate([[0], rank]))
    if last_seen is not None:
        keys.append(-last_seen)
    keys.append(-counts)
    order = np.lexsort(keys)  # the last key is the primary one
    return order[order != 0]


def _flat_items(train_histories: Any) -> np.ndarray:
    """All item indices of the training histories as one int64 array."""
    if isinstance(train_histories, pl.DataFrame):
        for column in ("history", schema.ITEM_IDX):
            if column in train_histories.columns:
                return _flat_items(train_histories[column])
        raise ValueError(
            f"training histories need a list column '{schema.ITEM_IDX}' or 'history', "
            f"got columns {train_histories.columns}"
        )
    if isinstance(train_histories, pl.Series):
        if not isinstance(train_histories.dtype, pl.List):
            raise ValueError(f"training histories must be a list column, got {train_histories.dtype}")
        values = train_histories.explode(empty_as_null=False, keep_nulls=False).drop_nulls()
        return values.to_numpy().astype(np.int64, copy=False)
    parts = [np.asarray(h, dtype=np.int64).reshape(-1) for h in train_histories]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


class PopularityScorer:
    """Score by number of training events of the item, identical for every user.

    With ``tie_break=True`` (default) the score is ``N + 1 - position`` in :func:`tie_order`
    (count descending, then the most recent training event, the raw id, a fixed hash):
    distinct float32 values (exact up to N = 2^24) that rank exactly like the counts. With
    ``tie_break=False`` the score is the raw count. The padding column 0 always scores lowest.

    Example::

        seen = fit_prefix(sequences, "leave_one_out")              # history + timestamp lists
        pop = PopularityScorer().fit(seen, n_items=N, item_ids=items["item_id"])
        raw = PopularityScorer(tie_break=False).fit(train_sequences, n_items=N)
        scores = pop.score(history, lengths)                        # (B, N+1) float32
    """

    name = "popularity"
    max_context: int | None = None  # ignores the history: any length is accepted

    def __init__(self, tie_break: bool = True) -> None:
        self.tie_break = tie_break
        self.counts: torch.Tensor | None = None  # (N+1,) int64 training counts, entry 0 = 0
        self._scores: torch.Tensor | None = None  # (N+1,) float32

    @property
    def n_items(self) -> int:
        """N, the catalog size the scorer was fitted for."""
        if self.counts is None:
            raise RuntimeError("PopularityScorer is not fitted: call fit(train_histories, n_items) first")
        return self.counts.shape[0] - 1

    def fit(
        self,
        train_histories: pl.DataFrame | pl.Series | Iterable[Sequence[int]],
        n_items: int,
        *,
        item_ids: pl.Series | None = None,
    ) -> "PopularityScorer":
        """Count item occurrences in the training histories.

        Args:
            train_histories: a DataFrame with a list column ``history`` (or ``item_idx``) and
                optionally ``timestamp`` (list<Int64>, aligned: then ties go to the item seen
                last), such a Series, or an iterable of per-user int arrays; values are item
                indices 1..N (0 = padding is ignored). Training events only: nothing held out.
            n_items: N, the catalog size.
            item_ids: (N,) raw ids of items 1..N (the vocabulary in ``item_idx`` order): the
                next tie-break, before the fixed index hash.

        Returns:
            self (fitted).

        Raises:
            ValueError: an item index outside 0..N; timestamps not aligned with the items;
                ``item_ids`` not of length N.
        """
        if n_items < 1:
            raise ValueError(f"n_items must be >= 1, got {n_items}")
        items = _flat_items(train_histories)
        times = _flat_times(train_histories)
        if items.size and (items.min() < 0 or items.max() > n_items):
            raise ValueError(f"training item indices must lie in 1..{n_items}, got {items.min()}..{items.max()}")
        if times is not None and times.shape != items.shape:
            raise ValueError(f"{times.size} timestamps for {items.size} training events: one per event is needed")
        counts = np.bincount(items, minlength=n_items + 1).astype(np.int64)
        counts[0] = 0
        if self.tie_break:
            last_seen = None
            if times is not None:
                last_seen = np.full(n_items + 1, -np.inf)
                np.maximum.at(last_seen, items, times.astype(np.float64))
            order = tie_order(counts, last_seen, item_ids)
            scores = np.zeros(n_items + 1, dtype=np.float32)
            scores[order] = np.arange(n_items, 0, -1, dtype=np.float32)  # N .. 1; padding 0
        else:
            scores = counts.astype(np.float32)
        self.counts = torch.from_numpy(counts)
        self._scores = torch.from_numpy(scores)
        return self

    def score(self, history: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B, L) int64 history and (B,) lengths -> (B, N+1) float32 scores (history unused)."""
        n_items = self.n_items  # raises when not fitted
        assert self._scores is not None
        return self._scores.to(history.device).unsqueeze(0).expand(history.shape[0], n_items + 1).clone()


BASELINES = {"popularity": PopularityScorer}
