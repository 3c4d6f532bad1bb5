"""Ranking metrics: hand-computed values, monotonicity in K, vectorised vs reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recsys_alibi.evaluation.metrics import (
    coverage_at_k,
    hit_rate_at_k,
    metric_names,
    mrr,
    ndcg_at_k,
    per_user_metrics,
    recall_at_k,
    reference_metrics,
)


@pytest.mark.parametrize("as_type", [list, np.array, torch.tensor])
def test_hand_computed_single_target(as_type):
    ranks = as_type([1, 3, 11])
    assert hit_rate_at_k(ranks, 10) == pytest.approx(2 / 3)
    assert ndcg_at_k(ranks, 10) == pytest.approx((1 + 1 / math.log2(4)) / 3)
    assert mrr(ranks) == pytest.approx((1 + 1 / 3 + 1 / 11) / 3)
    assert recall_at_k(ranks, 10) == pytest.approx(2 / 3)  # one target: Recall@K == HR@K
    assert hit_rate_at_k(ranks, 1) == pytest.approx(1 / 3)
    assert ndcg_at_k(ranks, 2) == pytest.approx(1 / 3)
    assert isinstance(hit_rate_at_k(ranks, 10), float)


def test_hand_computed_multi_target():
    ranks = np.array([[1, 4, 0], [12, 0, 0], [2, 3, 5]])  # 0 = empty slot
    k = 4
    idcg2 = 1 + 1 / math.log2(3)
    idcg3 = idcg2 + 1 / math.log2(4)
    assert hit_rate_at_k(ranks, k) == pytest.approx(2 / 3)
    assert recall_at_k(ranks, k) == pytest.approx((2 / 2 + 0 + 2 / 3) / 3)
    expected_ndcg = ((1 + 1 / math.log2(5)) / idcg2 + 0 + (1 / math.log2(3) + 1 / math.log2(4)) / idcg3) / 3
    assert ndcg_at_k(ranks, k) == pytest.approx(expected_ndcg)
    assert mrr(ranks) == pytest.approx((1 + 1 / 12 + 1 / 2) / 3)


def test_coverage():
    top = np.array([[1, 2, 0], [2, 3, 5]])
    assert coverage_at_k(top, 5) == pytest.approx(4 / 5)  # 1, 2, 3, 5; padding 0 ignored
    assert coverage_at_k(top, 5, k=1) == pytest.approx(2 / 5)
    assert coverage_at_k(torch.tensor(top), 10, k=2) == pytest.approx(3 / 10)


@pytest.mark.parametrize("bad", [[0, 1], [], [[0, 0]], [[-1, 2]]])
def test_invalid_ranks_raise(bad):
    with pytest.raises(ValueError):
        hit_rate_at_k(bad, 5)


def test_metric_names_order():
    assert metric_names([5, 10]) == [
        "HR@5", "NDCG@5", "Recall@5", "HR@10", "NDCG@10", "Recall@10", "MRR", "Coverage@5", "Coverage@10",
    ]


@settings(max_examples=60, deadline=None)
@given(ranks=st.lists(st.integers(1, 200), min_size=1, max_size=50), k=st.integers(1, 150))
def test_hr_ndcg_never_decrease_with_k(ranks, k):
    assert hit_rate_at_k(ranks, k + 1) >= hit_rate_at_k(ranks, k)
    assert ndcg_at_k(ranks, k + 1) >= ndcg_at_k(ranks, k)
    assert recall_at_k(ranks, k + 1) >= recall_at_k(ranks, k)
    assert 0.0 <= ndcg_at_k(ranks, k) <= hit_rate_at_k(ranks, k) <= 1.0


@settings(max_examples=60, deadline=None)
@given(
    users=st.lists(st.sets(st.integers(1, 60), min_size=1, max_size=6), min_size=1, max_size=20),
    ks=st.lists(st.integers(1, 70), min_size=1, max_size=4, unique=True),
)
def test_vectorised_matches_reference(users, ks):
    width = max(len(u) for u in users)
    matrix = np.zeros((len(users), width), dtype=np.int64)
    for i, ranks in enumerate(users):
        matrix[i, : len(ranks)] = sorted(ranks, reverse=True)  # slot order must not matter
    fast = {name: float(values.mean()) for name, values in per_user_metrics(matrix, ks).items()}
    ref = reference_metrics([sorted(u) for u in users], ks)
    assert fast.keys() == ref.keys()
    for name in ref:
        assert fast[name] == pytest.approx(ref[name]), name
    for k in ks:  # multi-target HR and Recall still never decrease with K; NDCG may
        assert hit_rate_at_k(matrix, k + 1) >= hit_rate_at_k(matrix, k)
        assert recall_at_k(matrix, k + 1) >= recall_at_k(matrix, k)
        assert ndcg_at_k(matrix, k) <= 1.0 + 1e-12


def test_a_cut_off_beyond_any_catalog_costs_no_memory_in_proportion_to_it():
    # evaluate.ks=[10, 2**40] allocated an 8 TiB IDCG table (a MemoryError traceback)
    assert ndcg_at_k([2**40], 2**41) == pytest.approx(1 / math.log2(2**40 + 1))
    two = [[1, 3, 0], [2, 0, 0]]  # hand: (1 / (1 + 1/log2 3) + 1/log2 3) / 2
    assert ndcg_at_k(two, 2**41) == pytest.approx(((1 + 0.5) / (1 + 1 / math.log2(3)) + 1 / math.log2(3)) / 2)


def test_bfloat16_and_other_torch_dtypes_give_the_hand_values():
    # finding 8 (break-api-s67): a bfloat16 tensor raised "Got unsupported ScalarType BFloat16"
    for dtype in (torch.bfloat16, torch.float16, torch.int32):
        ranks = torch.tensor([1, 2, 4], dtype=dtype)
        assert mrr(ranks) == pytest.approx((1 + 1 / 2 + 1 / 4) / 3), dtype
        assert hit_rate_at_k(ranks, 2) == pytest.approx(2 / 3), dtype
        assert ndcg_at_k(ranks, 4) == pytest.approx((1 + 1 / math.log2(3) + 1 / math.log2(5)) / 3), dtype
    two_d = torch.tensor([[3, 1, 0]], dtype=torch.bfloat16)  # hand: DCG 1 + 1/2, IDCG 1 + 1/log2 3
    assert ndcg_at_k(two_d, 3) == pytest.approx(1.5 / (1 + 1 / math.log2(3)))
    assert coverage_at_k(torch.tensor([[1, 2]], dtype=torch.bfloat16), 4) == pytest.approx(0.5)


def test_integral_floats_are_ranks():
    assert mrr([2.0, 4.0]) == pytest.approx((1 / 2 + 1 / 4) / 2)
    assert hit_rate_at_k(np.array([1.0, 3.0]), 2) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "bad,error,match",
    [
        ([1.5], ValueError, "ranks must be integers"),  # was HR@1 0.0, NDCG@2 0.757, MRR 0.667
        (torch.tensor([2.5]), ValueError, "ranks must be integers"),
        ([[1, 2.5, 0]], ValueError, "ranks must be integers"),
        ([True, True], TypeError, "booleans"),  # was MRR 1.0
        (torch.tensor([True]), TypeError, "booleans"),
        (np.array([[1, 1]]), ValueError, "distinct"),  # was NDCG@10 1.226 > 1
        ([[4, 0, 4]], ValueError, "distinct"),
        ([2.0, float("inf")], ValueError, "ranks must be finite"),  # said "at least one target rank >= 1"
        ([[1, float("inf")]], ValueError, "ranks must be finite"),
        ([float("nan")], ValueError, "ranks must be finite"),
        (["1", "2"], TypeError, "ranks must be 1-based integer"),  # was numpy's UFuncTypeError
        ([None, 1], TypeError, "ranks must be 1-based integer"),
    ],
)
def test_invalid_rank_values_raise_one_clear_error(bad, error, match):
    for fn in (lambda r: hit_rate_at_k(r, 1), lambda r: ndcg_at_k(r, 2), mrr, lambda r: per_user_metrics(r, [10])):
        with pytest.raises(error, match=match):
            fn(bad)


def test_unservable_targets_may_repeat_in_a_row():
    from recsys_alibi.evaluation.metrics import MISS_RANK

    ranks = np.array([[MISS_RANK, MISS_RANK, 0], [3, 0, 0]])  # hand: user 0 misses both, user 1 rank 3
    assert mrr(ranks) == pytest.approx((0 + 1 / 3) / 2)
    assert hit_rate_at_k(ranks, 5) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "k,error",
    [
        (float("nan"), ValueError),  # was "cannot convert float NaN to integer"
        (float("inf"), ValueError),  # was OverflowError
        (None, TypeError),  # was int()'s TypeError
        (2**70, ValueError),  # was OverflowError in NDCG (and at >= 2**62 misses would count as hits)
        (2**62, ValueError),
        ("10", TypeError),
        (True, TypeError),
        (0, ValueError),
        (2.5, ValueError),
    ],
)
def test_bad_k_raises_one_clear_error_naming_k(k, error):
    for fn in (hit_rate_at_k, ndcg_at_k, recall_at_k, lambda r, k: per_user_metrics(r, [k])):
        with pytest.raises(error, match="k must be a positive integer"):
            fn([1, 3], k)
    if k is not None:  # coverage_at_k's k=None means every column
        with pytest.raises(error, match="k must be a positive integer"):
            coverage_at_k([[1, 2]], 4, k=k)


def test_k_as_numpy_or_integral_float_still_works():
    assert hit_rate_at_k([1, 3], np.int64(2)) == pytest.approx(0.5)
    assert hit_rate_at_k([1, 3], 3.0) == pytest.approx(1.0)
    assert hit_rate_at_k([1, 3], 2**62 - 1) == pytest.approx(1.0)
