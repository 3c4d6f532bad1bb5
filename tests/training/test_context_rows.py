"""``train.warm.new_item_rows: context``: new item rows imprinted from the parent's hidden states."""

from __future__ import annotations

import numpy as np
import torch

from recsys_alibi.config import ModelConfig
from recsys_alibi.data.loader import FlatSequences
from recsys_alibi.model.transformer import AlibiRanker
from recsys_alibi.training.context_rows import context_means, imprinted_rows, occurrence_contexts


def _flat(rows: list[list[int]]) -> FlatSequences:
    return FlatSequences(values=np.array([v for r in rows for v in r], dtype=np.int64),
                         offsets=np.cumsum([0] + [len(r) for r in rows]))  # fmt: skip


# new vocabulary 1..6; items 5 and 6 are new (the parent knows 1..4 as 4, 3, 2, 1)
REMAP = np.array([0, 4, 3, 2, 1, 0, 0])
NEW = np.array([False, False, False, False, False, True, True])


def test_contexts_are_the_known_items_before_each_occurrence():
    items = _flat([[1, 5, 2, 3, 5], [5, 2], [6, 5, 1], [2, 3, 4, 6]])
    times = _flat([[10, 20, 30, 40, 50], [1, 2], [5, 6, 7], [1, 2, 3, 4]])
    contexts, ctimes, targets = occurrence_contexts(items, times, REMAP, NEW, max_len=2)
    # user 0: 5 after [1] and after [1, 2, 3] (last 2: [2, 3]); user 1: 5 first (no context);
    # user 2: 6 first, 5 after [6] (unknown only: none); user 3: 6 after [2, 3, 4] (last 2: [3, 4])
    assert [c.tolist() for c in contexts] == [[4], [3, 2], [2, 1]]
    assert [t.tolist() for t in ctimes] == [[10], [30, 40], [2, 3]]
    assert targets.tolist() == [5, 5, 6]
    assert occurrence_contexts(items, None, REMAP, NEW, max_len=2)[1] is None
    capped = occurrence_contexts(items, None, REMAP, NEW, max_len=2, max_per_item=1)
    assert [c.tolist() for c in capped[0]] == [[4], [2, 1]] and capped[2].tolist() == [5, 6]  # the first of each


def test_means_are_the_parents_last_hidden_states_averaged_per_item():
    torch.manual_seed(0)
    model = AlibiRanker(ModelConfig(d_model=8, n_heads=2, n_layers=1, max_len=4, attention_backend="sdpa"), 4)
    contexts = [np.array([4]), np.array([3, 2]), np.array([2, 1])]
    means, counts, overall = context_means(model, contexts, None, np.array([5, 5, 6]), n_rows=7, batch_size=2)
    model.eval()
    one = [model.last_hidden(torch.from_numpy(c)[None], torch.tensor([c.size]))[0] for c in contexts]
    assert counts.tolist() == [0, 0, 0, 0, 0, 2, 1]
    torch.testing.assert_close(means[5], (one[0] + one[1]) / 2)
    torch.testing.assert_close(means[6], one[2])
    torch.testing.assert_close(overall, (one[0] + one[1] + one[2]) / 3)
    assert torch.equal(means[:5], torch.zeros(5, 8))


def test_imprinted_rows_have_the_trained_spread_around_the_trained_mean():
    trained = torch.tensor([[1.0, 1.0], [3.0, 1.0], [2.0, 4.0]])  # mean (2, 2); distances 1.414, 1.414, 2
    rows = imprinted_rows(trained, torch.tensor([[5.0, 0.0], [0.0, -2.0]]), torch.tensor([1.0, 0.0]))
    spread = (2 * 2**0.5 + 2) / 3
    torch.testing.assert_close(rows, torch.tensor([[2 + spread, 2.0], [2 - spread / 5**0.5, 2 - 2 * spread / 5**0.5]]))
