"""Length-bucketed batches: every window once, a padded-token budget, attention bounded by lengths."""

from __future__ import annotations

import numpy as np
import pytest

from recsys_alibi.data.buckets import LengthBuckets


def _lengths() -> np.ndarray:
    rng = np.random.default_rng(3)  # long-tailed, like the default data: 20 .. 2,001 events
    return np.clip(np.rint(rng.lognormal(np.log(150), 0.9, 3000)), 20, 2001).astype(np.int64)


def test_every_window_once_under_the_token_budget_and_row_limit():
    lengths = _lengths()
    buckets = LengthBuckets(lengths, batch_tokens=8192, max_rows=64, seed=1)
    batches = list(buckets)
    assert sorted(i for b in batches for i in b) == list(range(3000))
    assert all(len(b) <= 64 for b in batches)
    assert all(len(b) * lengths[b].max() <= 8192 for b in batches)
    assert len(buckets) == len(batches)


def test_order_depends_on_seed_and_epoch_only():
    lengths = _lengths()
    a = LengthBuckets(lengths, 8192, 64, seed=1)
    assert a.batches(0) == LengthBuckets(lengths, 8192, 64, seed=1).batches(0)
    assert a.batches(0) != a.batches(1)
    a.set_epoch(1)
    assert list(a) == a.batches(1)


def test_attention_cost_is_bounded_by_the_lengths_not_rows_times_max_len_squared():
    lengths = _lengths()
    budget, rows = 8192, 64
    exact = float((lengths.astype(np.float64) ** 2).sum())  # the sum of each window's L^2 (packing's cost)
    bucketed = sum(len(b) * float(lengths[b].max()) ** 2 for b in LengthBuckets(lengths, budget, rows, seed=0))
    order = np.random.default_rng(0).permutation(3000)
    random = sum(len(b) * float(lengths[b].max()) ** 2 for b in np.array_split(order, 3000 // rows))
    assert bucketed < 1.2 * exact  # within 20 % of the sum of squares
    assert random > 4 * bucketed  # random batches of 64 pay for their longest window


def test_a_window_longer_than_the_budget_gets_its_own_batch():
    batches = LengthBuckets(np.array([10, 5000, 12]), batch_tokens=100, max_rows=8, seed=0).batches(0)
    assert sorted(map(sorted, batches)) == [[0, 2], [1]]
    with pytest.raises(ValueError, match="batch_tokens"):
        LengthBuckets(np.array([1]), 0, 8, seed=0)
