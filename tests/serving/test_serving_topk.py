"""Chunked top-K over the catalog against the full-matrix reference, on a tiny model."""

from __future__ import annotations

import pytest
import torch
from serving_fixtures import N_ITEMS, tiny_model

from recsys_alibi.data.loader import pad_right
from serving.topk import chunked_topk, topk_reference


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
