"""Ranking metrics from the 1-based ranks of held-out items (full-catalog ranking).

Every metric takes ``ranks``, the rank of each user's held-out item(s) in that user's ranked
list of the whole catalog (1 = best), and returns the mean over users as a Python float.

``ranks`` is either
- 1-D, shape (U,): one held-out item per user (leave-one-out), every entry >= 1; or
- 2-D, shape (U, T): up to T held-out items per user (temporal split), right-padded with 0
  (0 = "no target in this slot"); every row holds at least one rank >= 1 and the ranks of
  one row are distinct, ``MISS_RANK`` aside (``ranking.target_ranks`` guarantees both).

Definitions, for one user with relevant set R (n = |R| targets) and rank r_t of target t:
- ``HR@K``     1 if any r_t <= K else 0 (hit rate).
- ``Recall@K`` #{t : r_t <= K} / n. With one target this equals HR@K. The denominator is n
  (the textbook definition, never decreasing in K), not min(K, n): a user with more targets
  than K cannot reach 1.0. Some papers divide by min(K, n); state it when comparing.
- ``NDCG@K``   DCG / IDCG, DCG = sum_{t: r_t <= K} 1 / log2(r_t + 1),
  IDCG = sum_{i=1..min(K, n)} 1 / log2(i + 1). One target: 1 / log2(r + 1) if r <= K else 0.
  With one target HR@K and NDCG@K never decrease as K grows; with several, NDCG@K can
  (IDCG grows with K).
- ``MRR``      1 / min_t r_t (reciprocal rank of the best-ranked target); no cut-off.
- ``Coverage@K`` share of the catalog (items 1..N, padding 0 excluded) that appears in at
  least one user's top-K list.

A target that cannot be served (a seen item masked under ``exclude_seen``: the seen-item rule
of ``ranking``) has rank ``MISS_RANK``: it counts as a target (in n) that is never in the top
K, and its reciprocal rank is 0, not 1 / MISS_RANK.

Per-user values (``per_user_metrics``) feed the history-length slices; the scalar functions
are their means. ``reference_metrics`` is a plain-Python loop kept beside the vectorised path
for tests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "MISS_RANK",
    "coverage_at_k",
    "hit_rate_at_k",
    "metric_names",
    "mrr",
    "ndcg_at_k",
    "per_user_metrics",
    "recall_at_k",
    "reference_metrics",
]


MISS_RANK = 2**62  # the rank of a target that cannot be served (masked): beyond every K, reciprocal rank 0


def _rank_matrix(ranks: Any) -> np.ndarray:
    """Return ranks as a (U, T) float64 matrix with ``inf`` for empty slots; validate them.

    Raises:
        ValueError: empty input, a rank < 1 in 1-D input, a negative rank, a row without any
            target, or more than 2 dimensions.
    """
    if isinstance(ranks, torch.Tensor):
        arr = ranks.detach().cpu().numpy()
    else:
        arr = np.asarray(ranks)
    if arr.ndim == 1:
        arr = arr[:, None]
        if arr.size and np.min(arr) < 1:
            raise ValueError("ranks are 1-based: every rank must be >= 1")
    elif arr.ndim != 2:
        raise ValueError(f"ranks must be 1-D (U,) or 2-D (U, T), got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError("no ranks given: metrics need at least one user")
    arr = arr.astype(np.float64)
    if np.any(arr < 0) or np.any(np.isnan(arr)):
        raise ValueError("ranks must be >= 1 (0 marks an empty target slot in 2-D input)")
    arr[arr == 0] = np.inf
    if np.any(np.all(np.isinf(arr), axis=1)):
        raise ValueError("every user needs at least one target rank >= 1")
    return arr


def _check_k(k: int) -> int:
    if int(k) != k or k < 1:
        raise ValueError(f"k must be a positive integer, got {k}")
    return int(k)


def _idcg_table(k: int) -> np.ndarray:
    """(k + 1,) float64: entry n = IDCG with min(k, n) relevant items at the top (entry 0 = 0)."""
    return np.concatenate([[0.0], np.cumsum(1.0 / np.log2(np.arange(2, k + 2)))])


def _hits(r: np.ndarray, k: int) -> np.ndarray:
    return (r <= k).sum(axis=1)


def _hr(r: np.ndarray, k: int) -> np.ndarray:
    return (_hits(r, k) > 0).astype(np.float64)


def _recall(r: np.ndarray, k: int) -> np.ndarray:
    return _hits(r, k) / np.isfinite(r).sum(axis=1)


def _ndcg(r: np.ndarray, k: int) -> np.ndarray:
    gains = np.where(r <= k, 1.0 / np.log2(np.minimum(r, k) + 1.0), 0.0)
    n_targets = np.isfinite(r).sum(axis=1)
    return gains.sum(axis=1) / _idcg_table(min(k, r.shape[1]))[np.minimum(k, n_targets)]  # k beyond any catalog: O(T)


def _rr(r: np.ndarray) -> np.ndarray:
    best = r.min(axis=1)
    return np.where(best >= MISS_RANK, 0.0, 1.0 / best)


def hit_rate_at_k(ranks: Any, k: int) -> float:
    """HR@K: share of users with a held-out item in their top K.

    Args:
        ranks: (U,) ints >= 1, or (U, T) right-padded with 0; numpy, torch or list.
        k: cut-off, >= 1.

    Example: ``hit_rate_at_k([1, 3, 11], 10) == 2 / 3``.
    """
    return float(_hr(_rank_matrix(ranks), _check_k(k)).mean())


def ndcg_at_k(ranks: Any, k: int) -> float:
    """NDCG@K with binary relevance (one target: 1 / log2(rank + 1) if rank <= K else 0).

    Args:
        ranks: (U,) ints >= 1, or (U, T) right-padded with 0.
        k: cut-off, >= 1.
    """
    return float(_ndcg(_rank_matrix(ranks), _check_k(k)).mean())


def recall_at_k(ranks: Any, k: int) -> float:
    """Recall@K = #targets in the top K / #targets, averaged over users.

    Args:
        ranks: (U,) ints >= 1 (then Recall@K == HR@K), or (U, T) right-padded with 0.
        k: cut-off, >= 1.
    """
    return float(_recall(_rank_matrix(ranks), _check_k(k)).mean())


def mrr(ranks: Any) -> float:
    """Mean reciprocal rank of each user's best-ranked target (no cut-off).

    Args:
        ranks: (U,) ints >= 1, or (U, T) right-padded with 0.
    """
    return float(_rr(_rank_matrix(ranks)).mean())


def coverage_at_k(topk_items: Any, n_items: int, k: int | None = None) -> float:
    """Share of the catalog (items 1..N) found in at least one top-K list.

    Args:
        topk_items: (U, K') int item indices, best first; 0 entries (padding, or slots the
            caller blanked because they held masked items) are ignored.
        n_items: N, the catalog size without the padding index.
        k: use the first k columns (default: all K').
    """
    if n_items < 1:
        raise ValueError(f"n_items must be >= 1, got {n_items}")
    if isinstance(topk_items, torch.Tensor):
        arr = topk_items.detach().cpu().numpy()
    else:
        arr = np.asarray(topk_items)
    if arr.ndim != 2:
        raise ValueError(f"topk_items must be 2-D (U, K), got shape {arr.shape}")
    if k is not None:
        arr = arr[:, : _check_k(k)]
    items = np.unique(arr)
    items = items[(items >= 1) & (items <= n_items)]
    return float(items.size / n_items)


def metric_names(ks: Sequence[int]) -> list[str]:
    """Metric names in report order: HR@K, NDCG@K, Recall@K per K, then MRR, then Coverage@K."""
    names: list[str] = []
    for k in ks:
        names += [f"HR@{k}", f"NDCG@{k}", f"Recall@{k}"]
    return names + ["MRR"] + [f"Coverage@{k}" for k in ks]


def per_user_metrics(ranks: Any, ks: Sequence[int]) -> dict[str, np.ndarray]:
    """Per-user HR@K, NDCG@K, Recall@K for each K and the reciprocal rank ``"MRR"``.

    Args:
        ranks: (U,) or (U, T) as in the module docstring.
        ks: cut-offs.

    Returns:
        name -> (U,) float64; the mean of each array is the metric (Coverage is not per user).
    """
    r = _rank_matrix(ranks)
    out: dict[str, np.ndarray] = {}
    for k in ks:
        k = _check_k(k)
        out[f"HR@{k}"] = _hr(r, k)
        out[f"NDCG@{k}"] = _ndcg(r, k)
        out[f"Recall@{k}"] = _recall(r, k)
    out["MRR"] = _rr(r)
    return out


def reference_metrics(rank_lists: Sequence[Sequence[int]], ks: Sequence[int]) -> dict[str, float]:
    """Plain-Python reference: one list of distinct target ranks per user -> mean metrics.

    Used by tests to hold the vectorised path against; Coverage is not included.
    """
    sums: dict[str, float] = {}
    for ranks in rank_lists:
        n = len(ranks)
        for k in ks:
            in_top = [r for r in ranks if r <= k]
            dcg = sum(1.0 / math.log2(r + 1) for r in in_top)
            idcg = sum(1.0 / math.log2(i + 1) for i in range(1, min(k, n) + 1))
            sums[f"HR@{k}"] = sums.get(f"HR@{k}", 0.0) + (1.0 if in_top else 0.0)
            sums[f"NDCG@{k}"] = sums.get(f"NDCG@{k}", 0.0) + dcg / idcg
            sums[f"Recall@{k}"] = sums.get(f"Recall@{k}", 0.0) + len(in_top) / n
        sums["MRR"] = sums.get("MRR", 0.0) + (0.0 if min(ranks) >= MISS_RANK else 1.0 / min(ranks))
    return {name: total / len(rank_lists) for name, total in sums.items()}
