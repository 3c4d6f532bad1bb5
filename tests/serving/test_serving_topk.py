"""Chunked top-K over the catalog against the full-matrix reference, on a tiny model."""

from __future__ import annotations

import pytest
import torch
from serving_fixtures import N_ITEMS, tiny_model

from recsys_alibi.data.loader import pad_right
from recsys_alibi.evaluation.ranking import mask_seen, topk
from serving.topk import chunked_topk, reserve_new_items, topk_reference


def _histories(seed: int = 3, users: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(1, N_ITEMS + 1, (int(n),), generator=g).numpy() for n in torch.randint(1, 25, (users,), generator=g)]
    return pad_right(rows)


@pytest.mark.parametrize("chunk", [1, 4, 7, N_ITEMS, N_ITEMS + 1, 1000])
@pytest.mark.parametrize("exclude_seen", [True, False])
def test_chunked_topk_equals_full_matrix_topk(chunk, exclude_seen):
    model = tiny_model()
    history, lengths = _histories()
    with torch.inference_mode():
        hidden = model.last_hidden(history, lengths, backend="eager")  # (B, D)
        table = model.items.weight.detach()  # (N + 1, D)
        want_v, want_i = topk_reference(hidden, table, history, 10, exclude_seen=exclude_seen)
        got_v, got_i = chunked_topk(hidden, table, history, 10, chunk=chunk, exclude_seen=exclude_seen)
    assert torch.equal(got_i, want_i)
    torch.testing.assert_close(got_v, want_v, rtol=1e-6, atol=1e-6)
    # and the reference is the model's own scores, masked, fully sorted
    scores = model.score(history, lengths).detach()
    scores[:, 0] = float("-inf")
    if exclude_seen:
        scores.scatter_(1, history, float("-inf"))
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :10]
    assert torch.equal(want_i, order)


def test_ties_are_broken_by_item_index_whatever_the_chunk():
    hidden = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # (B=2, D=2)
    table = torch.tensor([[9.0, 9.0], [1.0, 0.0], [1.0, 0.0], [0.5, 1.0], [1.0, 1.0], [1.0, 0.0]])  # (N+1=6, D)
    seen = torch.tensor([[2], [0]])
    for chunk in (1, 2, 3, 6):
        values, items = chunked_topk(hidden, table, seen, 4, chunk=chunk)
        assert items.tolist() == [[1, 4, 5, 3], [3, 4, 1, 2]]
        assert values[0].tolist() == [1.0, 1.0, 1.0, 0.5]


def test_fewer_rankable_items_than_k_leaves_minus_inf_tail():
    hidden = torch.ones(1, 2)
    table = torch.randn(5, 2)  # N = 4
    values, items = chunked_topk(hidden, table, torch.tensor([[1, 2, 3]]), 10, chunk=2)
    assert values.shape == (1, 5)
    assert items[0, 0].item() == 4 and torch.isinf(values[0, 1:]).all()


def test_bad_chunk_is_an_error():
    with pytest.raises(ValueError, match="chunk"):
        chunked_topk(torch.ones(1, 2), torch.ones(3, 2), torch.zeros(1, 0, dtype=torch.int64), 2, chunk=0)


def test_reserved_slots_give_the_last_places_to_the_best_new_items_by_hand():
    inf = float("-inf")
    # items 1-6 known, 7-9 new; row 0: no new item in its top 4; row 1: new 8 already 2nd;
    # row 2: every new item masked by a rule; row 3: a masked tail (then every rankable new item is already in)
    values = torch.tensor([[9.0, 8.0, 7.0, 6.0], [9.0, 8.5, 7.0, 6.0], [9.0, 8.0, 7.0, 6.0], [9.0, 1.0, inf, inf]])
    indices = torch.tensor([[1, 2, 3, 4], [1, 8, 3, 4], [1, 2, 3, 4], [5, 7, 0, 0]])
    new_values = torch.tensor([[5.0, 4.0], [8.5, 2.0], [inf, inf], [1.0, inf]])
    new_indices = torch.tensor([[9, 7], [8, 9], [7, 8], [7, 9]])
    v, i = reserve_new_items(values, indices, new_values, new_indices, 1, 7)
    assert i.tolist() == [[1, 2, 3, 9], [1, 8, 3, 4], [1, 2, 3, 4], [5, 7, 0, 0]]
    assert v[0].tolist() == [9.0, 8.0, 7.0, 5.0]  # the slot item keeps its own score
    v, i = reserve_new_items(values, indices, new_values, new_indices, 2, 7)
    assert i.tolist() == [[1, 2, 9, 7], [1, 8, 3, 9], [1, 2, 3, 4], [5, 7, 0, 0]]
    assert v[1].tolist() == [9.0, 8.5, 7.0, 2.0]
    assert reserve_new_items(values, indices, new_values, new_indices, 0, 7)[1] is indices
    with pytest.raises(ValueError, match="slots must be in 0 .. 2"):
        reserve_new_items(values, indices, new_values, new_indices, 3, 7)
    # new items are told by their index, not by the new-item list: a near tie ordered otherwise there
    # neither pushes a new item out of the top K nor places more than the slots
    _, i = reserve_new_items(torch.tensor([[3.0, 2.5, 2.0]]), torch.tensor([[1, 2, 11]]), torch.tensor([[2.1]]),
                             torch.tensor([[10]]), 1, 10)  # fmt: skip
    assert i.tolist() == [[1, 2, 11]]
    _, i = reserve_new_items(torch.tensor([[3.0, 2.0, 1.5, 1.0]]), torch.tensor([[1, 11, 2, 3]]),
                             torch.tensor([[2.1, 2.0]]), torch.tensor([[10, 12]]), 2, 10)  # fmt: skip
    assert i.tolist() == [[1, 11, 2, 10]]


def test_chunked_topk_from_a_first_item_ranks_only_the_tail_of_the_catalog():
    model = tiny_model()
    history, lengths = _histories()
    with torch.inference_mode():
        hidden = model.last_hidden(history, lengths, backend="eager")  # (B, D)
        table = model.items.weight.detach()  # (N + 1, D)
        scores = mask_seen((hidden @ table.T).float(), history)  # (B, N + 1)
        scores[:, : N_ITEMS - 4] = float("-inf")  # the last 5 items only
        want_v, want_i = topk(scores, 3)
        got_v, got_i = chunked_topk(hidden, table, history, 3, chunk=2, first_item=N_ITEMS - 4)
    torch.testing.assert_close(got_v, want_v)  # a user who saw 3 of the 5 has a -inf (dropped) third place
    finite = torch.isfinite(want_v)
    assert int((~finite).sum()) == 1 and torch.equal(got_i[finite], want_i[finite]) and bool((got_i[finite] >= N_ITEMS - 4).all())
    # the same bits as in the whole catalog's pass with the same chunk (first_item inside a chunk)
    with torch.inference_mode():
        every_v, every_i = chunked_topk(hidden, table, history, N_ITEMS + 1, chunk=4)
        tail_v, tail_i = chunked_topk(hidden, table, history, 3, chunk=4, first_item=N_ITEMS - 4)
    same = every_v.gather(1, torch.argsort(every_i, dim=1))  # (B, N + 1) by item index
    assert torch.equal(tail_v[finite], same.gather(1, tail_i)[finite])
