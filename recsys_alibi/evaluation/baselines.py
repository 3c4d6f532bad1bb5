"""Non-learned baselines that implement the evaluator's ``Scorer`` protocol.

``PopularityScorer`` ranks every user's catalog by how often each item occurs in the training
events: the same list for everyone, minus the user's seen items (masked by the evaluator).
Items with equal counts are common (the long tail); by default they are ordered by item index
so that the scores are distinct and the optimistic tie rule of ``ranking.target_ranks`` cannot
flatter the baseline.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import polars as pl
import torch

from recsys_alibi.data import schema

__all__ = ["BASELINES", "PopularityScorer"]


def _flat_items(train_histories: Any) -> np.ndarray:
    """All item indices of the training histories as one int64 array."""
    if isinstance(train_histories, pl.DataFrame):
        for column in (schema.ITEM_IDX, "history"):
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

    With ``tie_break=True`` (default) the score is ``N + 1 - position`` in the order (count
    descending, item index ascending): distinct float32 values (exact up to N = 2^24) that rank
    exactly like the counts, ties going to the lower item index. With ``tie_break=False`` the
    score is the raw count. The padding column 0 always scores lowest.

    Example::

        pop = PopularityScorer().fit(train_sequences, n_items=N)   # DataFrame with item_idx lists
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

    def fit(self, train_histories: pl.DataFrame | pl.Series | Iterable[Sequence[int]], n_items: int) -> "PopularityScorer":
        """Count item occurrences in the training histories.

        Args:
            train_histories: a DataFrame with a list column ``item_idx`` (or ``history``), such a
                Series, or an iterable of per-user int arrays; values are item indices 1..N
                (0 = padding is ignored).
            n_items: N, the catalog size.

        Returns:
            self (fitted).

        Raises:
            ValueError: an item index outside 0..N.
        """
        if n_items < 1:
            raise ValueError(f"n_items must be >= 1, got {n_items}")
        items = _flat_items(train_histories)
        if items.size and (items.min() < 0 or items.max() > n_items):
            raise ValueError(f"training item indices must lie in 1..{n_items}, got {items.min()}..{items.max()}")
        counts = np.bincount(items, minlength=n_items + 1).astype(np.int64)
        counts[0] = 0
        if self.tie_break:
            order = np.lexsort((np.arange(n_items + 1), -counts))  # count desc, then index asc
            order = order[order != 0]
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
