"""Packing sequences into rows of a token budget: hand-worked plans and invariants."""

from __future__ import annotations

import random

import pytest
import torch

from recsys_alibi.model.packing import (
    batch_padding_waste,
    pack_items,
    pack_sequences,
    padding_waste,
)


def test_first_fit_decreasing_by_hand() -> None:
    # longest first: 7 -> r0, 5 -> r1, 4 -> r1, 3 -> r0 (fills it), 2 -> r2
    plan = pack_sequences([5, 3, 7, 2, 4], token_budget=10)
    assert plan.n_rows == 3
    assert plan.rows() == [[2, 1], [0, 4], [3]]
    assert plan.offset == (0, 7, 0, 0, 5)
    assert plan.n_tokens == 21
    assert plan.padding_waste == pytest.approx(1 - 21 / 30)


def test_first_fit_in_given_order() -> None:
    plan = pack_sequences([5, 3, 7, 2, 4], token_budget=10, order="given")
    assert plan.rows() == [[0, 1, 3], [2], [4]]


def test_truncation_and_errors() -> None:
    plan = pack_sequences([12, 3], token_budget=10)
    assert plan.lengths == (10, 3) and plan.n_truncated == 1
    with pytest.raises(ValueError, match="token_budget"):
        pack_sequences([12, 3], token_budget=10, truncate=False)
    with pytest.raises(ValueError, match="empty"):
        pack_sequences([3, 0], token_budget=10)
    with pytest.raises(ValueError):
        pack_sequences([3], token_budget=0)
    assert pack_sequences([], token_budget=4).n_rows == 0


def test_pack_items_layout() -> None:
    items = [torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6, 7, 8]), torch.arange(10, 22)]  # 5, 3, 12
    batch = pack_items(items, token_budget=8)
    # decreasing: 12 (cut to its last 8) -> r0, 5 -> r1, 3 -> r1
    assert batch.tokens.tolist() == [[14, 15, 16, 17, 18, 19, 20, 21], [1, 2, 3, 4, 5, 6, 7, 8]]
    assert batch.seq_ids.tolist() == [[3] * 8, [1] * 5 + [2] * 3]
    assert batch.last.tolist() == [[1, 4], [1, 7], [0, 7]]
    assert [int(batch.tokens[r, c]) for r, c in batch.last.tolist()] == [5, 8, 21]
    assert batch.tokens.dtype == torch.int64 and batch.seq_ids.dtype == torch.int64


def test_pack_items_right_pads_and_rejects_foreign_plan() -> None:
    items = [torch.tensor([4, 5]), torch.tensor([6])]
    batch = pack_items(items, token_budget=4)
    assert batch.tokens.tolist() == [[4, 5, 6, 0]]
    assert batch.seq_ids.tolist() == [[1, 1, 2, 0]]
    with pytest.raises(ValueError, match="plan"):
        pack_items(items, token_budget=4, plan=pack_sequences([3, 1], 4))


def test_random_plans_place_every_token_once() -> None:
    rng = random.Random(0)
    for _ in range(50):
        lens = [rng.randint(1, 40) for _ in range(rng.randint(1, 30))]
        budget = rng.randint(10, 64)
        for order in ("decreasing", "given"):
            plan = pack_sequences(lens, budget, order=order)
            used = [[False] * budget for _ in range(plan.n_rows)]
            for s, n in enumerate(plan.lengths):
                assert n == min(lens[s], budget)
                for c in range(plan.offset[s], plan.offset[s] + n):
                    assert not used[plan.row[s]][c]
                    used[plan.row[s]][c] = True
            assert sum(map(sum, used)) == plan.n_tokens
            assert plan.n_rows <= len(lens)


def test_padding_waste_figures() -> None:
    assert padding_waste([2, 4], width=4) == pytest.approx(0.25)
    assert padding_waste([2, 6], width=4) == pytest.approx(0.25)  # 6 is cut to 4
    assert batch_padding_waste([1, 3, 2, 2], batch_size=2) == pytest.approx(1 - 8 / 10)
    assert batch_padding_waste([1, 9], batch_size=2, max_len=3) == pytest.approx(1 - 4 / 6)
    assert padding_waste(torch.tensor([4, 4]), width=4) == 0.0
