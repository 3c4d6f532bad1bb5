"""The item feature encoder: shape and hand-computed values, both backends alike, the ranker with and
without features (without: the outputs of the code before features existed), id parts dropped, pickling."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from recsys_alibi.config import ItemFeaturesConfig, ModelConfig, TrainConfig
from recsys_alibi.model.embeddings import torchrec_unavailable
from recsys_alibi.model.item_features import CatalogFeatures, FeatureRows, ItemFeatureEncoder, ItemFeatures
from recsys_alibi.model.transformer import AlibiRanker
from recsys_alibi.training.module import RankerModule

NAN = float("nan")
CFG = ModelConfig(d_model=8, n_heads=2, n_layers=1, max_len=10, dropout=0.0)
BACKENDS = ["torch", pytest.param("torchrec", marks=pytest.mark.skipif(torchrec_unavailable() is not None,
                                                                       reason="torchrec cannot be imported here"))]  # fmt: skip


def _rows() -> FeatureRows:
    """Items: A genres {1, 2} year 2000; B genre {3} year missing; C no genre, 1990; D nothing."""
    return FeatureRows(("genre",), (torch.tensor([1, 2, 3]),), (torch.tensor([0, 2, 3, 3, 3]),),
                       torch.tensor([[2000.0], [NAN], [1990.0], [NAN]]))  # fmt: skip


def _catalog() -> CatalogFeatures:
    """Items 0..4 (0 = padding): 1 {a, b} 1990; 2 {a} 2000; 3 {c}; 4 {b} 1995."""
    rows = FeatureRows(("genre",), (torch.tensor([1, 2, 1, 3, 2]),), (torch.tensor([0, 0, 2, 3, 4, 5]),),
                       torch.tensor([[NAN], [1990.0], [2000.0], [NAN], [1995.0]]))  # fmt: skip
    decl = ItemFeaturesConfig(categorical=["genre"], numeric=["year"])
    return CatalogFeatures(decl, {"genre": ["a", "b", "c"]}, rows, np.array([False, True, True, True, True]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_encoder_values_by_hand(backend):
    enc = ItemFeatureEncoder(2, {"genre": 3}, 1, torch.tensor([1995.0]), torch.tensor([5.0]), backend=backend)
    with torch.no_grad():
        enc.bags.embedding_bags["feature_genre"].weight.copy_(torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        enc.numeric.weight.copy_(torch.tensor([[2.0], [-1.0]]))
    out = enc(_rows())  # (M=4, D=2)
    # A: [1,0] + [0,1] + z=(2000-1995)/5=1 -> [2,-1]; B: [1,1] (year missing = mean); C: z=-1 -> [-2,1]; D: 0
    assert out.shape == (4, 2) and out.dtype == torch.float32
    assert torch.equal(out, torch.tensor([[3.0, 0.0], [1.0, 1.0], [-2.0, 1.0], [0.0, 0.0]]))
    none = FeatureRows(("genre",), (torch.zeros(0, dtype=torch.int64),), (torch.zeros(1, dtype=torch.int64),),
                       torch.zeros(0, 1))  # fmt: skip
    assert enc(none).shape == (0, 2)  # no item at all (a table without new items)


@pytest.mark.skipif(torchrec_unavailable() is not None, reason="torchrec cannot be imported here")
def test_backends_share_keys_and_initial_weights():
    torch.manual_seed(3)
    plain = ItemFeatures(_catalog(), 8, "torch")
    torch.manual_seed(3)
    rec = ItemFeatures(_catalog(), 8, "torchrec")
    assert rec.encoder.backend == "torchrec" and plain.encoder.backend == "torch"
    assert list(plain.state_dict()) == list(rec.state_dict()) == [
        "encoder.numeric_mean", "encoder.numeric_std", "encoder.bags.embedding_bags.feature_genre.weight",
        "encoder.numeric.weight"]  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), rec.state_dict().values()))
    assert torch.equal(plain.vectors(), rec.vectors())


def test_catalog_standardisation_and_padding_row():
    feats = ItemFeatures(_catalog(), 8, "torch")
    assert feats.encoder.numeric_mean.tolist() == [1995.0]
    assert feats.encoder.numeric_std.item() == pytest.approx(np.sqrt(50 / 3))  # population std of 1990, 2000, 1995
    vectors = feats.vectors()
    assert vectors.shape == (5, 8) and torch.equal(vectors[0], torch.zeros(8))


def test_model_without_features_unchanged():
    """The outputs of the code before item features (commit a9c311c), same seed: not a bit moved."""
    torch.manual_seed(0)
    model = AlibiRanker(CFG, 6).eval()
    assert model.features is None and model.item_vectors() is model.items.weight
    assert not any("feature" in key for key in model.state_dict())
    scores = model.score(torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([3, 2])).detach()
    before = [0.1132144182920456, 0.016099514439702034, -0.09229519218206406, -0.023083282634615898,
              0.08140774071216583, -0.003949454054236412, 0.0054516978561878204, 0.0827963575720787,
              0.06558982282876968, -0.09135178476572037, -0.061017755419015884, 0.04287236928939819,
              -0.01771397702395916, 0.01151271816343069]  # fmt: skip
    assert torch.allclose(scores.flatten(), torch.tensor(before), rtol=0, atol=1e-7)
    torch.manual_seed(0)
    module = RankerModule(CFG, TrainConfig(), 6, torch.ones(7, dtype=torch.int64))
    module.log = lambda *args, **kwargs: None
    batch = {"inputs": torch.tensor([[1, 2, 3], [4, 5, 0]]), "lengths": torch.tensor([3, 2]),
             "targets": torch.tensor([[2, 3, 4], [5, 6, 0]])}  # fmt: skip
    assert float(module.training_step(batch, 0).detach()) == pytest.approx(1.779030203819275, abs=1e-6)


def test_feature_model_vectors_and_gradients():
    torch.manual_seed(0)
    model = AlibiRanker(CFG, 4)
    model.item_features = ItemFeatures(_catalog(), 8, "torch")
    vectors = model.item_vectors()
    assert torch.equal(vectors, model.items.weight + model.features.vectors())
    # inputs are the same vectors (tied): an encoded history reads item vectors, not id rows
    inputs = model.feature_inputs(torch.tensor([[2, 1, 0]]), torch.tensor([2]))
    assert torch.equal(inputs[0, :2], vectors[[2, 1]]) and torch.equal(inputs[0, 2], torch.zeros(8))
    model.score(torch.tensor([[1, 2, 0]]), torch.tensor([2]))[0, 3].backward()
    assert model.features.encoder.bags.embedding_bags["feature_genre"].weight.grad.abs().sum() > 0
    assert model.features.encoder.numeric.weight.grad.abs().sum() > 0


def test_id_part_dropped_for_rare_items():
    torch.manual_seed(0)
    model = AlibiRanker(CFG, 4)
    model.item_features = ItemFeatures(_catalog(), 8, "torch")
    dropped = model.features.set_id_counts(torch.tensor([0, 5, 1, 0, 3]), min_events=3)
    assert dropped == 2 and model.features.id_keep.tolist() == [1.0, 1.0, 0.0, 0.0, 1.0]
    vectors, own = model.item_vectors(), model.features.vectors()
    assert torch.equal(vectors[2], own[2]) and torch.equal(vectors[3], own[3])  # features alone
    assert torch.equal(vectors[1], model.items.weight[1] + own[1])


def test_id_dropout_scores_a_fresh_share_of_items_by_features_alone_in_training_only():
    cfg = CFG.model_copy(update={"item_features": CFG.item_features.model_copy(update={"enabled": True, "id_dropout": 0.5})})
    torch.manual_seed(0)
    model = AlibiRanker(cfg, 4)
    model.item_features = ItemFeatures(_catalog(), 8, "torch")
    ids, own = model.items.weight, model.features.vectors()
    model.train()
    masks = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        kept = (torch.rand(5) >= 0.5).float()  # the draw item_vectors makes after the same seed
        torch.manual_seed(seed)
        assert torch.equal(model.item_vectors(), ids * kept[:, None] + own)
        masks.append(kept.tolist())
    assert masks[0] != masks[1]  # drawn afresh at each step
    model.eval()  # scoring and validation: every id row
    assert torch.equal(model.item_vectors(), ids + own)


def test_id_dropout_needs_the_features_and_a_share_below_one():
    with pytest.raises(ValueError, match="id_dropout"):
        ModelConfig(item_features={"id_dropout": 0.25})
    with pytest.raises(ValueError, match="id_dropout"):
        ModelConfig(item_features={"enabled": True, "id_dropout": 1.0})


@pytest.mark.parametrize("backend", BACKENDS)
def test_pickled_feature_model_scores_the_same(backend):
    torch.manual_seed(0)
    model = AlibiRanker(CFG, 4)
    model.item_features = ItemFeatures(_catalog(), 8, backend)
    model.features.set_id_counts(torch.tensor([0, 5, 1, 0, 3]), min_events=3)
    model.eval()
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False).eval()
    history, lengths = torch.tensor([[1, 2, 0]]), torch.tensor([2])
    with torch.no_grad():
        assert torch.equal(model.score(history, lengths), loaded.score(history, lengths))
        assert loaded.features.vocabularies == {"genre": ["a", "b", "c"]} and loaded.features.id_keep.tolist()[2] == 0.0
        first = loaded.features.vectors()
        assert loaded.features.vectors() is first  # cached without gradients
        loaded.features.encoder.numeric.weight.add_(1.0)
        assert not torch.equal(loaded.features.vectors(), first)  # a changed weight is seen
