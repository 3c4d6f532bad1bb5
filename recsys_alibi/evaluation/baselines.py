"""Non-learned baselines that implement the evaluator's ``Scorer`` protocol.

``PopularityScorer`` ranks every user's catalog by how often each item occurs in the training
events: the same list for everyone, minus the user's seen items (masked by the evaluator).
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
    """Score = number of training events of the item (float32), identical for every user.

    Example::

        pop = PopularityScorer().fit(train_sequences, n_items=N)   # DataFrame with item_idx lists
        scores = pop.score(history, lengths)                        # (B, N+1) float32
    """

    name = "popularity"
    max_context: int | None = None  # ignores the history: any length is accepted

    def __init__(self) -> None:
        self.counts: torch.Tensor | None = None  # (N+1,) float32, entry 0 = 0

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
        counts = np.bincount(items, minlength=n_items + 1).astype(np.float32)
        counts[0] = 0.0
        self.counts = torch.from_numpy(counts)
        return self

    def score(self, history: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B, L) int64 history and (B,) lengths -> (B, N+1) float32 counts (history unused)."""
        n_items = self.n_items  # raises when not fitted
        assert self.counts is not None
        return self.counts.to(history.device).unsqueeze(0).expand(history.shape[0], n_items + 1).clone()


BASELINES = {"popularity": PopularityScorer}
