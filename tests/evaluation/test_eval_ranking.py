"""Seen-item masking, target ranks and top-K: fast paths against the plain references."""

from __future__ import annotations

import math

import pytest
import torch

from recsys_alibi.evaluation.metrics import per_user_metrics
from recsys_alibi.evaluation.ranking import (
    MISS_RANK,
    ChunkedTopK,
    mask_seen,
    mask_seen_reference,
    target_ranks,
    target_ranks_reference,
    topk,
    topk_reference,
)

NEG = -math.inf


def _tied_scores(gen: torch.Generator, b: int, n_cols: int, levels: int = 5) -> torch.Tensor:
    """(B, C) float32 with few distinct values, so that ties are everywhere."""
    return torch.randint(0, levels, (b, n_cols), generator=gen).float()


def test_mask_seen_hand_example():
    scores = torch.tensor([[9.0, 1.0, 2.0, 3.0, 4.0], [9.0, 1.0, 2.0, 3.0, 4.0]])
    history = torch.tensor([[1, 3, 0], [2, 2, 4]])
    out = mask_seen(scores.clone(), history)
    assert out.tolist() == [[NEG, NEG, 2.0, NEG, 4.0], [NEG, 1.0, NEG, 3.0, NEG]]
    out = mask_seen(scores.clone(), history, exclude_seen=False)
    assert out.tolist() == [[NEG, 1.0, 2.0, 3.0, 4.0], [NEG, 1.0, 2.0, 3.0, 4.0]]  # padding column only


def test_a_repeated_target_is_a_miss_and_the_candidates_do_not_depend_on_the_target():
    """Issue 31 defect 3: the masked candidate set is the same whatever the held-out item, and a seen
    target is a miss (rank MISS_RANK: beyond every K, reciprocal rank 0), also in a tiny catalog
    where fewer than K items are left; without exclude_seen the same target is ranked."""
    scores = torch.tensor([[0.0, 5.0, 4.0, 3.0, 2.0]])  # items 1..4, item 1 best
    history = torch.tensor([[1, 3]])
    masked = [mask_seen(scores.clone(), history).tolist() for _ in (1, 2, 3, 4)]  # no target argument at all
    assert masked[0] == [[NEG, NEG, 4.0, NEG, 2.0]]
    masked = mask_seen(scores.clone(), history)
    assert target_ranks(masked, torch.tensor([1])).tolist() == [MISS_RANK]  # seen, was best: a miss
    assert target_ranks(masked, torch.tensor([4])).tolist() == [2]  # unseen: behind item 2 only
    assert target_ranks(masked, torch.tensor([3]), ties="pessimistic").tolist() == [MISS_RANK]
    assert target_ranks(masked, torch.tensor([[1, 4, 0]])).tolist() == [[MISS_RANK, 2, 0]]
    metrics = per_user_metrics(target_ranks(masked, torch.tensor([1])).numpy(), [1, 10])
    assert {name: float(v[0]) for name, v in metrics.items()} == {
        "HR@1": 0.0, "NDCG@1": 0.0, "Recall@1": 0.0, "HR@10": 0.0, "NDCG@10": 0.0, "Recall@10": 0.0, "MRR": 0.0
    }  # 2 rankable items < K = 10: still not a hit
    unmasked = mask_seen(scores.clone(), history, exclude_seen=False)
    assert target_ranks(unmasked, torch.tensor([1])).tolist() == [1]


def test_mask_seen_is_in_place_and_keeps_padding_masked():
    scores = torch.zeros(1, 4)
    out = mask_seen(scores, torch.tensor([[2, 0]]))
    assert out is scores
    assert scores.tolist() == [[NEG, 0.0, NEG, 0.0]]


def test_mask_seen_matches_reference_and_chunks():
    gen = torch.Generator().manual_seed(0)
    b, n_cols = 16, 41
    scores = torch.randn(b, n_cols, generator=gen)
    history = torch.randint(0, n_cols, (b, 12), generator=gen)
    expected = mask_seen_reference(scores, history)
    assert torch.equal(mask_seen(scores.clone(), history), expected)
    for chunk in (1, 7, 16):  # a catalog chunk masked alone equals the same columns of the whole
        for start in range(0, n_cols, chunk):
            part = mask_seen(scores[:, start : start + chunk].clone(), history, offset=start)
            assert torch.equal(part, expected[:, start : start + chunk])


def test_target_ranks_hand_example_and_tie_rules():
    scores = torch.tensor([[NEG, 5.0, 3.0, 3.0, 3.0, 1.0]])
    assert target_ranks(scores, torch.tensor([1])).tolist() == [1]
    assert target_ranks(scores, torch.tensor([5])).tolist() == [5]
    # item 3 ties with items 2 and 4: optimistic = 1 + #greater, pessimistic = #greater-or-equal
    assert target_ranks(scores, torch.tensor([3]), ties="optimistic").tolist() == [2]
    assert target_ranks(scores, torch.tensor([3]), ties="pessimistic").tolist() == [4]
    # several targets: padding 0 -> 0, a repeated item counts once, tied targets get distinct ranks
    targets = torch.tensor([[3, 2, 0, 3, 5]])
    assert target_ranks(scores, targets).tolist() == [[2, 3, 0, 0, 5]]
    assert target_ranks(scores, targets, ties="pessimistic").tolist() == [[4, 3, 0, 0, 5]]


def test_all_equal_scores_show_why_ties_matter():
    scores = torch.zeros(2, 11)
    scores[:, 0] = NEG
    assert target_ranks(scores, torch.tensor([4, 7])).tolist() == [1, 1]
    assert target_ranks(scores, torch.tensor([4, 7]), ties="pessimistic").tolist() == [10, 10]


@pytest.mark.parametrize("ties", ["optimistic", "pessimistic"])
@pytest.mark.parametrize("seed", range(4))
def test_target_ranks_match_reference(ties, seed):
    gen = torch.Generator().manual_seed(seed)
    b, n_cols = 12, 30
    scores = _tied_scores(gen, b, n_cols)
    scores = mask_seen(scores, torch.randint(0, n_cols, (b, 8), generator=gen))  # seen targets: misses
    single = torch.randint(1, n_cols, (b,), generator=gen)
    assert torch.equal(target_ranks(scores, single, ties), target_ranks_reference(scores, single, ties))
    multi = torch.randint(0, n_cols, (b, 6), generator=gen)  # padding and repeats included
    multi[:, 0] = torch.randint(1, n_cols, (b,), generator=gen)
    fast = target_ranks(scores, multi, ties)
    assert torch.equal(fast, target_ranks_reference(scores, multi, ties))
    assert (fast == MISS_RANK).any()
    for row in fast.tolist():  # ranks of one row are distinct, misses aside
        ranked = [r for r in row if 0 < r < MISS_RANK]
        assert len(ranked) == len(set(ranked))


def test_topk_hand_example_ties_by_lower_index():
    scores = torch.tensor([[NEG, 2.0, 5.0, 2.0, 5.0, 2.0]])
    values, indices = topk(scores, 3)
    assert values.tolist() == [[5.0, 5.0, 2.0]]
    assert indices.tolist() == [[2, 4, 1]]
    values, indices = topk(scores, 100)  # clipped to the number of columns
    assert indices.tolist() == [[2, 4, 1, 3, 5, 0]]


@pytest.mark.parametrize("k", [1, 3, 10, 40])
@pytest.mark.parametrize("seed", range(3))
def test_topk_and_chunked_match_reference(k, seed):
    gen = torch.Generator().manual_seed(seed)
    b, n_cols = 9, 37
    scores = _tied_scores(gen, b, n_cols, levels=4)
    scores[:, 0] = NEG
    scores[0, 5:20] = NEG  # more masked items than free slots in some rows
    ref_values, ref_indices = topk_reference(scores, k)
    values, indices = topk(scores, k)
    assert torch.equal(values, ref_values) and torch.equal(indices, ref_indices)
    for chunk in (1, 5, 16, n_cols):
        starts = list(range(0, n_cols, chunk))
        for order in (starts, starts[::-1]):  # chunk order does not matter
            running = ChunkedTopK(k)
            for start in order:
                running.update(scores[:, start : start + chunk], offset=start)
            values, indices = running.result()
            want = min(k, n_cols)
            assert torch.equal(values, ref_values[:, :want]), (chunk, order)
            assert torch.equal(indices, ref_indices[:, :want]), (chunk, order)


def test_chunked_topk_requires_an_update():
    with pytest.raises(ValueError):
        ChunkedTopK(3).result()


def test_topk_fast_path_without_ties_matches_reference():
    gen = torch.Generator().manual_seed(1)
    scores = torch.randn(64, 500, generator=gen)  # distinct values: torch.topk result is kept
    for k in (1, 10, 100, 499, 500):
        values, indices = topk(scores, k)
        ref_values, ref_indices = topk_reference(scores, k)
        assert torch.equal(values, ref_values) and torch.equal(indices, ref_indices)


def test_mask_seen_accepts_inference_tensors():
    with torch.inference_mode():
        scores = torch.zeros(1, 4)  # e.g. a scorer decorated with @torch.inference_mode()
    out = mask_seen(scores, torch.tensor([[2]]))
    assert out.tolist() == [[NEG, 0.0, NEG, 0.0]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    gen = torch.Generator().manual_seed(3)
    scores = _tied_scores(gen, 32, 300, levels=50)
    history = torch.randint(0, 300, (32, 40), generator=gen)
    targets = torch.randint(1, 300, (32, 4), generator=gen)
    cpu = mask_seen(scores.clone(), history)
    gpu = mask_seen(scores.cuda(), history.cuda())
    assert torch.equal(gpu.cpu(), cpu)
    assert torch.equal(target_ranks(gpu, targets.cuda()).cpu(), target_ranks(cpu, targets))
    for got, want in zip(topk(gpu, 20), topk(cpu, 20)):
        assert torch.equal(got.cpu(), want)


def test_topk_mixes_tied_and_untied_rows_like_the_reference():
    torch.manual_seed(3)
    scores = torch.randn(6, 40)
    scores[1, [3, 7, 9]] = 5.0  # row 1: a three-way tie at the top
    scores[4, 10:] = -1.0  # row 4: a long tie across the K boundary
    scores[5, 30:] = float("-inf")  # row 5: fewer finite items than K would need... still 30 of them
    for k in (1, 5, 12, 35):
        values, indices = topk(scores, k)
        ref_values, ref_indices = topk_reference(scores, k)
        assert torch.equal(indices, ref_indices) and torch.equal(values, ref_values)
