"""Ranking metrics from the 1-based ranks of held-out items (full-catalog ranking).

Every metric takes ``ranks``, the rank of each user's held-out item(s) in that user's ranked
list of the whole catalog (1 = best), and returns the mean over users as a Python float.

``ranks`` is either
- 1-D, shape (U,): one held-out item per user (leave-one-out), every entry >= 1; or
- 2-D, shape (U, T): up to T held-out items per user (temporal split), right-padded with 0
  (0 = "no target in this slot"); every row holds at least one rank >= 1 and the ranks of
  one row are distinct, ``MISS_RANK`` aside (``ranking.target_ranks`` guarantees both).

Ranks are integers: an integer dtype, or floats with integral values (``2.0``); the functions
refuse non-integral (``1.5``), non-finite and boolean ranks, strings, repeated ranks within a
row and a ``k`` that is not a positive integer below ``MISS_RANK``, each with one
``ValueError``/``TypeError``. Tensors of any dtype, bfloat16 included, are accepted.

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
import numbers
import operator
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


def _as_array(values: Any) -> np.ndarray:
    """numpy view of a list, array or tensor; torch dtypes numpy lacks (bfloat16) go via float64."""
    if isinstance(values, torch.Tensor):
        t = values.detach().cpu()
        if t.is_floating_point() and t.dtype not in (torch.float16, torch.float32, torch.float64):
            t = t.to(torch.float64)  # bfloat16 (and float8): exact, numpy has no such dtype
        return t.numpy()
    return np.asarray(values)


def _rank_matrix(ranks: Any) -> np.ndarray:
    """Return ranks as a (U, T) float64 matrix with ``inf`` for empty slots; validate them.

    Ranks are 1-based integers: integer dtypes, or floats holding integral values (2.0).

    Raises:
        TypeError: ranks that are not numbers (strings, objects) or are booleans.
        ValueError: empty input, a non-finite or non-integral rank, a rank < 1 in 1-D input,
            a negative rank, a repeated rank within one row of 2-D input (``MISS_RANK``
            aside), a row without any target, or more than 2 dimensions.
    """
    arr = _as_array(ranks)
    if arr.dtype.kind == "b":
        raise TypeError("ranks must be 1-based integer ranks, got booleans")
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"ranks must be 1-based integer ranks (numbers), got dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr[:, None]
        if arr.size and np.min(arr) < 1:
            raise ValueError("ranks are 1-based: every rank must be >= 1")
    elif arr.ndim != 2:
        raise ValueError(f"ranks must be 1-D (U,) or 2-D (U, T), got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError("no ranks given: metrics need at least one user")
    is_float = arr.dtype.kind == "f"
    arr = arr.astype(np.float64)
    if is_float:  # integer dtypes are integral and finite already
        if not np.all(np.isfinite(arr)):
            raise ValueError("ranks must be finite (got NaN or inf); ranks are 1-based integers")
        if np.any(arr != np.floor(arr)):
            bad = arr[arr != np.floor(arr)][0]
            raise ValueError(f"ranks must be integers (1-based positions), got {bad}")
    if np.any(arr < 0):
        raise ValueError("ranks must be >= 1 (0 marks an empty target slot in 2-D input)")
    if arr.shape[1] > 1:  # the ranks of one row are distinct positions (0 padding and MISS_RANK aside)
        srt = np.sort(arr, axis=1)
        same = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] > 0) & (srt[:, 1:] < MISS_RANK)
        if np.any(same):
            row = int(np.nonzero(same.any(axis=1))[0][0])
            raise ValueError(
                f"ranks of one user must be distinct: row {row} repeats rank {int(srt[row, 1:][same[row]][0])}"
            )
    arr[arr == 0] = np.inf
    if np.any(np.all(np.isinf(arr), axis=1)):
        raise ValueError("every user needs at least one target rank >= 1")
    return arr


def _check_k(k: Any) -> int:
    """``k`` as a Python int in [1, MISS_RANK); one ValueError/TypeError naming ``k`` otherwise."""
    if isinstance(k, (bool, np.bool_, str, bytes)) or not (isinstance(k, numbers.Real) or hasattr(k, "__index__")):
        raise TypeError(f"k must be a positive integer, got {k!r} ({type(k).__name__})")
    if not isinstance(k, numbers.Real):  # a 0-d integer tensor
        try:
            value = operator.index(k)
        except TypeError:
            raise TypeError(f"k must be a positive integer, got {k!r} ({type(k).__name__})") from None
    elif isinstance(k, numbers.Integral):
        value = int(k)
    else:
        kf = float(k)
        if not (math.isfinite(kf) and kf.is_integer()):
            raise ValueError(f"k must be a positive integer, got {k!r}")
        value = int(kf)
    if value < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if value >= MISS_RANK:  # a cut-off at MISS_RANK would count unservable targets as hits
        raise ValueError(f"k must be a positive integer below 2**62 (the rank of an unservable target), got {k!r}")
    return value


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
    arr = _as_array(topk_items)
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
