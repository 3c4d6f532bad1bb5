"""Paired comparisons: the per-user difference, its bootstrap interval, and the evaluator's slices."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch

from recsys_alibi.config import EvaluateConfig
from recsys_alibi.evaluation.evaluator import EvaluationResult, evaluate
from recsys_alibi.evaluation.paired import PairedDifference, paired_difference, paired_trend


def test_paired_difference_hand_computed_means_and_a_constant_difference():
    d = paired_difference(np.array([1.0, 0.0, 1.0, 1.0]), np.array([0.0, 0.0, 1.0, 0.0]))
    assert (d.n_users, d.baseline, d.candidate, d.difference) == (4, 0.25, 0.75, 0.5)
    assert d.ratio == 3.0 and 0.0 <= d.ci95[0] <= 0.5 <= d.ci95[1] <= 1.0
    same = paired_difference(np.array([0.5, 0.7, 0.9]), np.array([0.4, 0.6, 0.8]))
    assert same.ci95 == pytest.approx((0.1, 0.1)) and same.excludes_zero


def test_paired_interval_matches_the_normal_approximation_and_pairs_users():
    rng = np.random.default_rng(0)
    base = rng.random(4000)  # users differ a lot; the candidate is each user's value + 0.02 +- noise
    cand = base + 0.02 + rng.normal(0, 0.1, 4000)
    d = paired_difference(cand, base)
    half = 1.96 * (cand - base).std(ddof=1) / math.sqrt(4000)  # 0.0031
    assert d.ci95[0] == pytest.approx(d.difference - half, abs=6e-4)
    assert d.ci95[1] == pytest.approx(d.difference + half, abs=6e-4)
    assert d.excludes_zero  # an unpaired interval (sd of each side ~0.29) would be ~3x wider and hold 0
    assert paired_difference(cand, base).to_json() == d.to_json()  # seeded
    assert PairedDifference.from_json(d.to_json()) == d


def test_cluster_interval_by_hand_two_users():
    # user A: two pairs with difference 1; user B: one pair with difference 0. A resample of 2 users is AA (mean 1,
    # p 1/4), AB or BA (2/3, p 1/2) or BB (0, p 1/4): the 2.5th and 97.5th percentiles are 0 and 1
    d = paired_difference(np.array([1.0, 1.0, 0.0]), np.zeros(3), clusters=["A", "A", "B"])
    assert d.difference == pytest.approx(2 / 3) and d.ci95 == (0.0, 1.0)
    one = paired_difference(np.array([1.0, 0.0, 0.5]), np.zeros(3), clusters=[7, 7, 7])  # one user: the point
    assert one.ci95 == pytest.approx((0.5, 0.5))


def test_cluster_interval_counts_a_repeated_user_once():
    # 400 users, each with 10 pairs of one difference (a user recurring over seeds and steps): the evidence is
    # 400 values, not 4,000; the cluster interval is the normal one of the 400 user means, the pair interval
    # about sqrt(10) narrower
    rng = np.random.default_rng(1)
    per_user = 0.02 + rng.normal(0, 0.1, 400)
    diff, users = np.repeat(per_user, 10), np.repeat(np.arange(400), 10)
    by_user = paired_difference(diff, np.zeros(4000), clusters=users)
    by_pair = paired_difference(diff, np.zeros(4000))
    half = 1.96 * per_user.std(ddof=1) / math.sqrt(400)  # 0.0098
    assert by_user.difference == pytest.approx(per_user.mean())
    assert by_user.ci95[0] == pytest.approx(by_user.difference - half, abs=1.2e-3)
    assert by_user.ci95[1] == pytest.approx(by_user.difference + half, abs=1.2e-3)
    ratio = (by_user.ci95[1] - by_user.ci95[0]) / (by_pair.ci95[1] - by_pair.ci95[0])
    assert 2.6 < ratio < 3.8  # sqrt(10) = 3.16
    assert paired_difference(diff, np.zeros(4000), clusters=users) == by_user  # seeded
    with pytest.raises(ValueError, match="one label per pair"):
        paired_difference(diff, np.zeros(4000), clusters=users[:-1])


@pytest.mark.parametrize("a, b", [(np.zeros(3), np.zeros(4)), (np.zeros(0), np.zeros(0)), (np.array([np.nan]), np.zeros(1))])
def test_paired_difference_rejects_unpaired_or_nan_values(a, b):
    with pytest.raises(ValueError, match="paired values"):
        paired_difference(a, b)


class OldestItemScorer:
    """Scores ``-0.01 * item`` plus 1 for item ``history[0] + 1``: right only when the oldest event is in the context."""

    name = "oldest"
    max_context = None

    def score(self, history: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        scores = -0.01 * torch.arange(11, dtype=torch.float32).expand(history.shape[0], -1).clone()
        scores[torch.arange(history.shape[0]), history[:, 0] + 1] += 1.0
        return scores


def test_evaluator_reports_heavy_user_slices_and_whole_history_against_a_short_context():
    # the target is the oldest event + 1: the whole history ranks it first for every user. With the
    # last 2 events, users 0 and 1 still see it; user 2 boosts 10 instead (unseen above the target 6:
    # 10, 1, 3, 4 -> rank 5); user 3 boosts 3, seen and masked (unseen above 8: 1, 5, 6 -> rank 4)
    rows = [([1, 5], [2]), ([3, 7], [4]), ([5, 8, 9, 2], [6]), ([7, 9, 4, 2, 3], [8])]
    examples = pl.DataFrame(
        {"user_id": [10, 11, 12, 13], "history": [h for h, _ in rows], "targets": [t for _, t in rows]},
        schema={"user_id": pl.Int64, "history": pl.List(pl.Int32), "targets": pl.List(pl.Int32)},
    )
    cfg = EvaluateConfig(ks=[1, 10], history_buckets=[2, 4], min_history=[4, 5, 50])
    r = evaluate(OldestItemScorer(), examples, 10, cfg, protocol_name="loo", context_lengths=[2, None])
    assert r.metrics["HR@1"] == 1.0 and r.by_context_length["2"]["HR@1"] == 0.5
    assert set(r.by_min_history) == {">=4", ">=5"}  # nobody has 50 events
    assert r.by_min_history[">=5"]["NDCG@10"] == 1.0
    heavy = r.paired_vs_context["2"][">=4"]["NDCG@10"]
    short = (1 / math.log2(6) + 1 / math.log2(5)) / 2
    assert heavy["n_users"] == 2 and heavy["candidate"] == 1.0
    assert heavy["baseline"] == pytest.approx(short) and heavy["difference"] == pytest.approx(1 - short)
    overall = r.paired_vs_context["2"]["all"]
    assert overall["NDCG@10"]["baseline"] == pytest.approx((2 + 2 * short) / 2 / 2)
    assert overall["HR@10"]["difference"] == 0.0 and overall["HR@10"]["ci95"] == [0.0, 0.0]  # ranks 5, 4 are in the top 10
    lo, hi = overall["NDCG@10"]["ci95"]
    assert 0.0 <= lo <= overall["NDCG@10"]["difference"] <= hi <= 1 - short
    assert list(r.user_ids) == [10, 11, 12, 13] and r.per_user["HR@1"].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert r.history_lengths.tolist() == [2, 2, 4, 5]
    doc = r.to_json()
    assert EvaluationResult.from_json(doc).to_json() == doc


def test_paired_trend_is_the_least_squares_slope_of_the_differences():
    # differences .1 .2 | .3 .2 | .5 .4 at steps 1 | 2 | 3: x - mean(x) = -1, 0, 1; sum of (x - 2)(d - mean d) = 0.6
    # over sum of (x - 2)^2 = 4 -> 0.15 per step
    steps = np.array([1, 1, 2, 2, 3, 3])
    slope, (low, high) = paired_trend(steps, np.array([0.6, 0.7, 0.8, 0.7, 1.0, 0.9]), np.full(6, 0.5))
    assert slope == pytest.approx(0.15)
    assert low <= slope <= high and low > 0  # no resample of these pairs slopes downward
    flat, ci = paired_trend(steps, np.array([0.1, 0.3, 0.3, 0.1, 0.2, 0.2]), np.zeros(6))
    assert flat == pytest.approx(0.0) and ci[0] < 0 < ci[1]


def test_paired_trend_refuses_a_single_step_and_bad_shapes():
    with pytest.raises(ValueError, match="two steps"):
        paired_trend(np.array([2, 2]), np.array([0.1, 0.2]), np.zeros(2))
    with pytest.raises(ValueError, match="same pairs"):
        paired_trend(np.array([1, 2]), np.array([0.1, 0.2, 0.3]), np.zeros(3))
