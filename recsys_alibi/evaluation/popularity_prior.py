"""Recency-weighted item popularity, the prior that ``score.popularity_prior`` adds to a model's logits.

``c_i = sum over the events of item i before `as_of` of 0.5 ** (age_days / half_life_days)`` (``half_life_days``
None: plain counts), and the prior is ``weight * log(1 + c_i)``. Ranking by ``logit_i + weight * log(1 + c_i)``
is ranking by ``p_model(i) * (1 + c_i) ** weight`` (a logit and a log-softmax differ by a constant per user): a
product of the sequence model and recent popularity, the baseline that "A Re-visit of the Popularity Baseline in
Recommender Systems" (Ji et al., SIGIR 2020, arXiv 2005.13829) shows strong when the test lies after the training
time. Why and when it pays, with the walk-forward choice of weight and half-life: docs/results.md, "A recent-
popularity prior on the next periods", and ``benchmarks/replay_prior.py``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import torch

from recsys_alibi.config import PRIOR_INF_WEIGHT

DAY_SECONDS = 86_400
BETAS = (0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, math.inf)  # inf: the counts first, the model breaks ties
HALF_LIVES = (1.0, 3.0, 7.0, 14.0, 28.0, None)  # days; None: plain counts
GRID = tuple((b, h) for b in BETAS for h in HALF_LIVES)
"""The (weight, half-life) points a walk-forward choice compares (``benchmarks/replay_prior.py``, the daily
pipeline's ``score.popularity_prior.choose``)."""
TIE_SCALE = 1e6  # weight inf: log(1 + c) * TIE_SCALE + logit in float64 (logits lie far less than 1e6 apart)
INF_WEIGHT = PRIOR_INF_WEIGHT  # weight inf in ``score`` (float32): the counts decide wherever log(1 + c) differs by > ~0.03


def recency_counts(prepared: Path, as_of: int, half_lives: tuple[float | None, ...]) -> np.ndarray:
    """Recency-weighted event counts of every catalog item of a prepared directory.

    Args:
        prepared: a ``prepare`` output (``sequences.parquet`` with ``item_idx`` and ``timestamp`` lists,
            ``items.parquet`` with ``item_idx`` 1..N).
        as_of: the time the counts are for, seconds (events at or after it are not counted; a later event
            would be a leak).
        half_lives: days per output row; None: every event weighs 1.

    Returns:
        (len(half_lives), N + 1) float64, column ``i`` for ``item_idx`` i, column 0 (padding) 0.

    Raises:
        ValueError: a half-life that is not above 0.
    """
    from recsys_alibi.data.prepare import read_items, read_sequences

    n_items = read_items(prepared).height
    events = read_sequences(prepared).select("item_idx", "timestamp").explode("item_idx", "timestamp")
    events = events.filter(pl.col("timestamp") < as_of)
    return weighted_counts(events["item_idx"].to_numpy(), events["timestamp"].to_numpy(), as_of, n_items, half_lives)


def grid_metrics(scores: torch.Tensor, targets: torch.Tensor, logprior: torch.Tensor) -> np.ndarray:
    """NDCG@10 and HR@10 of each row's target under every point of :data:`GRID`.

    Args:
        scores: (B, N + 1) float logits, seen items and padding at -inf (``mask_seen``).
        targets: (B,) int64 item indices 1..N.
        logprior: (len(HALF_LIVES), N + 1) float64 ``log(1 + c)`` per half-life (column 0 padding).

    Returns:
        (B, len(GRID), 2) float64 [NDCG@10, HR@10]: ranks as ``evaluation.ranking.target_ranks`` gives them (ties
        optimistic; a target at -inf, a seen item, is a miss).
    """
    from recsys_alibi.evaluation.ranking import target_ranks

    logits = scores.double()
    out = np.zeros((scores.shape[0], len(GRID), 2))
    for g, (beta, half_life) in enumerate(GRID):
        p = logprior[HALF_LIVES.index(half_life)][None, :]  # (1, N + 1)
        s = p * TIE_SCALE + logits if math.isinf(beta) else logits + beta * p  # (B, N + 1); -inf stays -inf
        rank = target_ranks(s, targets).numpy()  # (B,)
        hit = rank <= 10
        out[:, g, 0] = np.where(hit, 1.0 / np.log2(rank + 1.0), 0.0)
        out[:, g, 1] = hit
    return out


def weighted_counts(items: np.ndarray, timestamps: np.ndarray, as_of: int, n_items: int,
                    half_lives: tuple[float | None, ...]) -> np.ndarray:  # fmt: skip
    """(len(half_lives), N + 1) float64 counts of ``items`` (E,) int item_idx 1..N at ``timestamps`` (E,) seconds,
    each weighted ``0.5 ** ((as_of - t) / (half_life * 86400))`` (:func:`recency_counts`).

    Raises:
        ValueError: a half-life that is not above 0, an item outside 1..N.
    """
    if any(h is not None and not h > 0 for h in half_lives):
        raise ValueError(f"half-lives must be above 0 days, got {half_lives}")
    items = np.asarray(items, dtype=np.int64)
    if items.size and (items.min() < 1 or items.max() > n_items):
        raise ValueError(f"item indices must lie in 1..{n_items}")
    age_days = (as_of - np.asarray(timestamps, dtype=np.float64)) / DAY_SECONDS  # (E,)
    out = np.zeros((len(half_lives), n_items + 1))
    for row, half_life in enumerate(half_lives):
        weights = np.ones_like(age_days) if half_life is None else np.exp2(-age_days / half_life)
        out[row] = np.bincount(items, weights=weights, minlength=n_items + 1)
    return out


def item_popularity(sequences: Path, items: pl.DataFrame, half_life_days: float | None,
                    name: str | None = None) -> pl.DataFrame:  # fmt: skip
    """Recency-weighted counts of the items of a sequences file, as of one second after its newest event.

    Args:
        sequences: a ``sequences.parquet`` (``item_idx`` and ``timestamp`` lists) of a prepared or staged
            directory.
        items: the vocabulary its ``item_idx`` refer to (``item_idx`` 1..N, ``item_id``): the directory's
            ``items.parquet``, or the model's for a bare sequences file in the model's numbering.
        half_life_days: days (None: plain counts).
        name: how the error names the input (the user's path, not a staged copy); default ``sequences``.

    Returns:
        ``item_id`` (the vocabulary's dtype), ``popularity`` float64, one row per item with an event.

    Raises:
        DataError: no ``timestamp`` lists, or time taken from line order (``sequences_have_real_timestamps``): the
            prior would weigh events by their position in a file.
    """
    from recsys_alibi.data.ingest import DataError
    from recsys_alibi.data.time_gaps import sequences_have_real_timestamps

    if "timestamp" not in pl.read_parquet_schema(sequences) or not sequences_have_real_timestamps(sequences):
        raise DataError(f"score.popularity_prior needs event times and {name or sequences} has none (or took them from "
                        "line order); set score.popularity_prior.weight=0 or score a log with timestamps")  # fmt: skip
    events = pl.read_parquet(sequences, columns=["item_idx", "timestamp"]).explode("item_idx", "timestamp").drop_nulls()
    if events.height == 0:
        return pl.DataFrame(schema={"item_id": items["item_id"].dtype, "popularity": pl.Float64})
    as_of = int(events["timestamp"].max()) + 1
    n_items = int(items["item_idx"].max())
    counts = weighted_counts(events["item_idx"].to_numpy(), events["timestamp"].to_numpy(), as_of, n_items,
                             (half_life_days,))[0]  # fmt: skip
    ordered = items.sort("item_idx")
    return pl.DataFrame({"item_id": ordered["item_id"], "popularity": counts[ordered["item_idx"].to_numpy()]}).filter(
        pl.col("popularity") > 0)


def item_bias(popularity: pl.DataFrame, item_ids: pl.Series, weight: float) -> np.ndarray:
    """(N + 1,) float32 ``weight * log(1 + c)`` aligned to ``item_ids`` (index i: the item at ``item_idx`` i, index
    0 padding, null), 0 for an item without events (a new item)."""
    lookup = dict(zip(popularity["item_id"].to_list(), popularity["popularity"].to_list()))
    counts = np.array([lookup.get(i, 0.0) if i is not None else 0.0 for i in item_ids.to_list()], dtype=np.float64)
    return (weight * np.log1p(counts)).astype(np.float32)
