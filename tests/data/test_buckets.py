"""Length-bucketed batches: every window once, a padded-token budget, attention bounded by lengths;
under data-parallel training as many batches on every rank."""

from __future__ import annotations

import numpy as np
import pytest

from recsys_alibi.data.buckets import EqualStepBuckets, LengthBuckets, LongestFirst, rank_window_lengths, split_to_count


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


# --- data-parallel training: every rank takes as many steps (issue 31, defect 11)


def test_every_rank_serves_as_many_batches_each_window_once_within_the_budget():
    lengths = _lengths()
    every_rank = [lengths[:1500], np.sort(lengths[1500:])[::-1].copy()]  # the second rank has the long tail
    plain = [len(LengthBuckets(x, 8192, 32, seed=2).batches(e)) for x in every_rank for e in range(3)]
    assert plain[:3] != plain[3:]  # without equalising, the ranks would disagree (a collective mismatch)
    for epoch in range(3):
        served = [EqualStepBuckets(every_rank, r, 8192, 32, seed=2).batches(epoch) for r in range(2)]
        assert len(served[0]) == len(served[1]) == max(plain[epoch], plain[3 + epoch])
        for x, batches in zip(every_rank, served):
            assert sorted(i for b in batches for i in b) == list(range(1500))  # every window exactly once
            assert all(len(b) <= 32 and len(b) * x[b].max() <= 8192 for b in batches)


def test_split_to_count_halves_the_largest_batch_and_repeats_only_single_windows():
    assert split_to_count([[1, 2, 3], [4]], 3) == [[1], [2, 3], [4]]
    assert split_to_count([[1], [2]], 4) == [[1], [2], [1], [2]]  # nothing left to split: wrap around
    assert split_to_count([[1, 2]], 1) == [[1, 2]]


def test_rank_window_lengths_follow_the_users_each_rank_reads():
    fit = np.array([3, 10, 40, 5, 7])  # fit-prefix lengths m; one window of min(m - 1, max_len + 1) events
    assert [x.tolist() for x in rank_window_lengths(fit, max_len=8, world_size=2)] == [[2, 9, 9], [4, 6, 2]]


def test_longest_first_scores_every_row_once_within_both_budgets_longest_first():
    lengths = _lengths()
    batches = list(LongestFirst(lengths, max_rows=256, max_tokens=8192))
    assert sorted(i for b in batches for i in b) == list(range(3000))
    assert all(len(b) <= 256 and len(b) * lengths[b].max() <= 8192 for b in batches)
    firsts = [int(lengths[b[0]]) for b in batches]
    assert firsts == sorted(firsts, reverse=True) and firsts[0] == lengths.max()
    assert all(lengths[b[0]] == lengths[b].max() for b in batches)
    padded = sum(len(b) * int(lengths[b].max()) for b in batches)
    order = np.random.default_rng(0).permutation(3000)  # what random batches of 256 pad
    random = sum(len(b) * int(lengths[b].max()) for b in np.array_split(order, 3000 // 256))
    assert padded < 1.1 * lengths.sum() < random / 4
    assert len(LongestFirst(lengths, 256, 8192)) == len(batches)
    with pytest.raises(ValueError, match="max_tokens"):
        LongestFirst(lengths, 256, 0)
