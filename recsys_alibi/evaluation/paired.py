"""Paired comparisons of two scorers (or two context lengths) on the same users.

Two rankings of the same users are compared user by user: the per-user difference of a metric
(``candidate - baseline``) is averaged, and its 95 % confidence interval is the percentile
bootstrap over users (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13),
computed with :func:`scipy.stats.bootstrap` on the differences (resampling users keeps each
user's pair together, so the interval is that of a paired test). An interval that excludes 0
says the gain is larger than the noise of which users happened to be evaluated.

Pairs pooled over seeds and steps of a replay repeat users: one user is a pair at every (seed, step)
where it has a target, and its pairs move together. Given each pair's user (``clusters``), the
interval resamples whole users with all their pairs (the cluster bootstrap: Davison & Hinkley,
*Bootstrap Methods and their Application*, 1997, section 3.8; Field & Welsh, JRSS B 69(3), 2007),
so repeated users are not counted as independent evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["N_RESAMPLES", "PairedDifference", "paired_difference", "paired_trend"]

N_RESAMPLES = 2000  # bootstrap resamples of the users
LEVEL = 0.95


@dataclass(frozen=True)
class PairedDifference:
    """The per-user paired difference of one metric, ``candidate - baseline``.

    Attributes:
        n_users: users compared (U).
        baseline, candidate: the two means.
        difference: ``candidate - baseline`` (the mean of the per-user differences).
        ci95: (low, high) percentile-bootstrap 95 % interval of ``difference``.
        ratio: ``candidate / baseline`` (None when the baseline mean is 0).
    """

    n_users: int
    baseline: float
    candidate: float
    difference: float
    ci95: tuple[float, float]
    ratio: float | None

    @property
    def excludes_zero(self) -> bool:
        """True when the whole interval lies on one side of 0."""
        return self.ci95[0] > 0 or self.ci95[1] < 0

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types: ``n_users``, ``baseline``, ``candidate``, ``difference``, ``ci95`` [low, high], ``ratio``."""
        return {
            "n_users": self.n_users, "baseline": self.baseline, "candidate": self.candidate,
            "difference": self.difference, "ci95": list(self.ci95), "ratio": self.ratio,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "PairedDifference":
        """Inverse of :meth:`to_json`."""
        low, high = data["ci95"]
        return cls(int(data["n_users"]), float(data["baseline"]), float(data["candidate"]),
                   float(data["difference"]), (float(low), float(high)), data.get("ratio"))  # fmt: skip


def paired_difference(
    candidate: np.ndarray,
    baseline: np.ndarray,
    *,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    clusters: np.ndarray | None = None,
) -> PairedDifference:
    """Mean per-user difference ``candidate - baseline`` with a percentile-bootstrap 95 % CI.

    Args:
        candidate, baseline: (U,) float per-user metric values (e.g. NDCG@10) of the same users
            in the same order.
        n_resamples: bootstrap resamples (2,000 by default).
        seed: seed of the resampling (the same inputs and seed give the same interval).
        clusters: optional (U,) label of each pair's unit (e.g. the user of each (seed, step, user)
            pair; any hashable values): whole units are resampled with all their pairs and each
            resample's statistic is its pairs' mean (module doc). None: every pair is its own unit.

    Returns:
        :class:`PairedDifference`. With a single user (or unit, or identical values) the interval
        is the point itself.

    Raises:
        ValueError: shapes differ, an input is empty, or holds NaN.
    """
    from scipy.stats import bootstrap

    a = np.asarray(candidate, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"paired values need two (U,) arrays of the same users, got {a.shape} and {b.shape}")
    if np.isnan(a).any() or np.isnan(b).any():
        raise ValueError("paired values hold NaN")
    if clusters is not None and len(clusters) != a.size:
        raise ValueError(f"clusters need one label per pair, got {len(clusters)} for {a.size} pairs")
    diff = a - b
    mean = float(diff.mean())
    if a.size == 1 or np.all(diff == diff[0]):
        ci = (mean, mean)
    elif clusters is not None:
        ci = _cluster_interval(diff, clusters, n_resamples, seed)
    else:
        res = bootstrap((diff,), np.mean, n_resamples=n_resamples, confidence_level=LEVEL, method="percentile",
                        vectorized=True, rng=np.random.default_rng(seed))  # fmt: skip
        ci = (float(res.confidence_interval.low), float(res.confidence_interval.high))
    base = float(b.mean())
    return PairedDifference(int(a.size), base, float(a.mean()), mean, ci, float(a.mean()) / base if base else None)


def _cluster_interval(diff: np.ndarray, clusters, n_resamples: int, seed: int) -> tuple[float, float]:
    """Percentile interval of the mean of ``diff`` (P,) when whole clusters (``clusters``: (P,) labels) are
    resampled with replacement: each resample draws C of the C clusters, its statistic the mean over the
    drawn clusters' pairs (sum of their differences / number of their pairs)."""
    _, index = np.unique(np.asarray(clusters, dtype=object).astype(str), return_inverse=True)
    sums, counts = np.bincount(index, weights=diff), np.bincount(index).astype(np.float64)
    if sums.size == 1:
        mean = float(diff.mean())
        return (mean, mean)
    rng = np.random.default_rng(seed)
    stats = np.empty(n_resamples)
    for start in range(0, n_resamples, 200):  # (200, C) draws at a time: bounded memory for many clusters
        drawn = rng.integers(0, sums.size, size=(min(200, n_resamples - start), sums.size))
        stats[start : start + len(drawn)] = sums[drawn].sum(axis=1) / counts[drawn].sum(axis=1)
    low, high = np.percentile(stats, [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2])
    return (float(low), float(high))


def paired_trend(
    steps: np.ndarray, candidate: np.ndarray, baseline: np.ndarray, *, n_resamples: int = N_RESAMPLES, seed: int = 0
) -> tuple[float, tuple[float, float]]:
    """Trend of a paired difference over steps: the least-squares slope of ``candidate - baseline``
    against ``steps``, with a percentile-bootstrap 95 % CI that resamples the (step, user) pairs.

    A replay asks whether the warm start falls behind retraining as the chain grows: a slope whose
    interval lies below 0 is a downward trend.

    Args:
        steps: (P,) step number of each pair (e.g. 1..8); candidate, baseline: (P,) float per-pair
            metric values (e.g. NDCG@10), in the same order.
        n_resamples, seed: as in :func:`paired_difference`.

    Returns:
        (slope in metric units per step, (low, high)).

    Raises:
        ValueError: shapes differ, an input is empty or holds NaN, or every pair has the same step.
    """
    from scipy.stats import bootstrap

    x = np.asarray(steps, dtype=np.float64)
    d = np.asarray(candidate, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    if x.shape != d.shape or x.ndim != 1 or x.size == 0:
        raise ValueError(f"a trend needs (P,) steps and values of the same pairs, got {x.shape} and {d.shape}")
    if np.isnan(x).any() or np.isnan(d).any():
        raise ValueError("trend values hold NaN")
    if np.all(x == x[0]):
        raise ValueError("a trend needs pairs from at least two steps")

    def slope(xs: np.ndarray, ds: np.ndarray, axis: int = -1) -> np.ndarray:  # 0 for a resample of one step
        xc = xs - xs.mean(axis=axis, keepdims=True)
        var, cov = (xc * xc).sum(axis=axis), (xc * ds).sum(axis=axis)
        return np.divide(cov, var, out=np.zeros_like(var), where=var > 0)

    point = float(slope(x, d))
    res = bootstrap((x, d), slope, paired=True, vectorized=True, n_resamples=n_resamples, confidence_level=LEVEL,
                    method="percentile", rng=np.random.default_rng(seed))  # fmt: skip
    return point, (float(res.confidence_interval.low), float(res.confidence_interval.high))
