"""The time-gap table: a second torchrec table whose row is added to each position's item row."""

from __future__ import annotations

import pickle

import pytest
import torch

from recsys_alibi.config import ModelConfig
from recsys_alibi.model.embeddings import TIME_GAP_TABLE, ItemEmbeddings
from recsys_alibi.model.scorer import RankerScorer
from recsys_alibi.model.transformer import AlibiRanker


def test_each_position_is_item_row_plus_gap_row():
    torch.manual_seed(0)
    emb = ItemEmbeddings(n_items=10, d_model=8, time_gap_buckets=5)
    items = torch.tensor([[3, 7, 0], [9, 0, 0]])
    gaps = torch.tensor([[1, 4, 0], [1, 0, 0]])
    lengths = torch.tensor([2, 1])
    got = emb(items, lengths, gaps)  # (B, L, D)
    item_table = emb.weight
    gap_table = emb.collection.embeddings[TIME_GAP_TABLE].weight
    assert gap_table.shape == (5, 8)
    want = item_table[items] + gap_table[gaps]
    want[items == 0] = 0.0  # padding stays zero
    torch.testing.assert_close(got, want)


def test_gaps_required_exactly_when_the_table_exists():
    with_gaps = ItemEmbeddings(n_items=10, d_model=8, time_gap_buckets=5)
    items_only = ItemEmbeddings(n_items=10, d_model=8)
    items, lengths = torch.tensor([[3, 7]]), torch.tensor([2])
    with pytest.raises(ValueError, match="pass gaps"):
        with_gaps(items, lengths)
    with pytest.raises(ValueError, match="no time-gap table"):
        items_only(items, lengths, torch.tensor([[1, 2]]))
    checked = ItemEmbeddings(n_items=10, d_model=8, time_gap_buckets=5, check_inputs=True)  # reads the tensor
    with pytest.raises(ValueError, match=r"0\.\.4"):
        checked(items, lengths, torch.tensor([[1, 5]]))
    with pytest.raises(ValueError, match="shape"):
        with_gaps(items, lengths, torch.tensor([[1]]))


def test_ranker_scores_depend_on_gaps_and_scorer_passes_them():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=1, dropout=0.0, attention_backend="sdpa", time_gap_buckets=8)
    model = AlibiRanker(cfg, n_items=20).eval()
    assert model.uses_time_gaps
    history, lengths = torch.tensor([[3, 4, 5]]), torch.tensor([3])
    near = model.score(history, lengths, torch.tensor([[1, 2, 2]]))
    far = model.score(history, lengths, torch.tensor([[1, 2, 7]]))
    assert near.shape == (1, 21) and not torch.allclose(near, far)
    scorer = RankerScorer(model)
    assert scorer.uses_time_gaps
    torch.testing.assert_close(scorer.score(history, lengths, torch.tensor([[1, 2, 7]])), far)


def test_models_pickled_before_time_gaps_load_as_items_only():
    emb = ItemEmbeddings(n_items=10, d_model=8)
    del emb.__dict__["time_gap_buckets"]  # as pickled by a version without the attribute
    restored = pickle.loads(pickle.dumps(emb))
    assert restored.time_gap_buckets == 0
    assert restored(torch.tensor([[3]]), torch.tensor([1])).shape == (1, 1, 8)


def test_config_checks():
    with pytest.raises(ValueError, match="at least 3"):
        ModelConfig(time_gap_buckets=2)
    with pytest.raises(ValueError, match="shard_embeddings"):
        ModelConfig(time_gap_buckets=8, shard_embeddings=True)
