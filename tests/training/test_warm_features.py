"""Warm start with item features: a new item starts as its trained feature encoding (id row zeros), one
without a table row keeps the noise rule, the feature tables grow by value; mixed models are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recsys_alibi.config import ItemFeaturesConfig, JobConfig, ModelConfig
from recsys_alibi.model.item_features import CatalogFeatures, FeatureRows, ItemFeatures
from recsys_alibi.model.transformer import AlibiRanker
from recsys_alibi.training.warm_features import WarmFeatures, warm_features
from recsys_alibi.training.warm_start import ITEM_TABLE_KEY, WarmStartError, new_item_rows, warm_state_dict

CFG = ModelConfig(d_model=8, n_heads=2, n_layers=1, max_len=10, dropout=0.0, item_features={"enabled": True})
DECL = ItemFeaturesConfig(categorical=["genre"], numeric=["year"])


def _catalog(vocab: list[str], genres: list[list[int]], years: list[float], with_row: list[bool]) -> CatalogFeatures:
    lengths = [len(g) for g in genres]
    rows = FeatureRows(("genre",), (torch.tensor([v for g in genres for v in g], dtype=torch.int64),),
                       (torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64),),
                       torch.tensor(years).reshape(-1, 1))  # fmt: skip
    return CatalogFeatures(DECL, {"genre": vocab}, rows, np.array(with_row))


def _model(catalog: CatalogFeatures, n_items: int, seed: int) -> AlibiRanker:
    torch.manual_seed(seed)
    model = AlibiRanker(CFG, n_items)
    model.item_features = ItemFeatures(catalog, CFG.d_model, "torch")
    return model


def test_new_items_start_from_their_features_and_tables_grow_by_value():
    nan = float("nan")
    # old: items 1 {a} 1990, 2 {b} 2000; values a, b
    old = _model(_catalog(["a", "b"], [[], [1], [2]], [nan, 1990.0, 2000.0], [False, True, True]), 2, seed=0)
    # new vocabulary renumbered (b first) with a new value c; items: 1 = old 2, 2 = old 1, 3 new {a, c} 1995 with a
    # row, 4 new without a table row
    new_catalog = _catalog(["b", "a", "c"], [[], [1], [2], [2, 3], []], [nan, 2000.0, 1990.0, 1995.0, nan],
                           [False, True, True, True, False])  # fmt: skip
    rows = np.array([0, 2, 1, 0, 0])
    warm = WarmFeatures(old.features.vocabularies, new_catalog.vocabularies, new_catalog.with_row)
    state = warm_state_dict(old.state_dict(), rows, CFG, CFG, seed=7, features=warm)
    table = state["item_features.encoder.bags.embedding_bags.feature_genre.weight"]
    before = old.state_dict()["item_features.encoder.bags.embedding_bags.feature_genre.weight"]
    assert torch.equal(table[1], before[2]) and torch.equal(table[2], before[1])  # b, a: by value
    assert torch.equal(table[3], torch.zeros(8)) and torch.equal(table[0], before[0])  # c: new, zeros
    noise = new_item_rows(old.state_dict()[ITEM_TABLE_KEY][1:], 2, seed=7)
    assert torch.equal(state[ITEM_TABLE_KEY][3], torch.zeros(8))  # with features: the id row is zeros
    assert torch.equal(state[ITEM_TABLE_KEY][4], noise[1])  # without: the noise rule, as before
    new = _model(new_catalog, 4, seed=1)
    new.load_state_dict(state, strict=True)
    with torch.no_grad():
        # item 3's vector is the old encoder's encoding of {a} and 1995 (c unknown to it, a zero row now)
        expected = old.features.encoder(FeatureRows(("genre",), (torch.tensor([1]),), (torch.tensor([0, 1]),),
                                                    torch.tensor([[1995.0]])))[0]  # fmt: skip
        assert torch.allclose(new.item_vectors()[3], expected, atol=1e-7)
        assert torch.equal(new.item_vectors()[1], old.item_vectors()[2])  # a kept item: its vector unchanged


def test_a_model_without_features_cannot_start_one_with_them(tmp_path):
    torch.manual_seed(0)
    id_only = AlibiRanker(ModelConfig(d_model=8, n_heads=2, n_layers=1, max_len=10), 3)
    config = JobConfig(model=CFG.model_dump())
    with pytest.raises(WarmStartError, match="it reads no item features and model.item_features.enabled=true"):
        warm_features(id_only, config, tmp_path, 3)
    assert warm_features(id_only, JobConfig(), tmp_path, 3) is None
