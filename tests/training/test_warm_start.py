"""Warm start: shared items keep their trained rows by raw id, new rows follow the rule, the rest is copied."""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import numpy as np
import polars as pl
import pytest
import torch

from recsys_alibi.config import ModelConfig
from recsys_alibi.data import schema
from recsys_alibi.model.embeddings import torchrec_unavailable
from recsys_alibi.model.transformer import AlibiRanker
from recsys_alibi.training.warm_start import (
    ITEM_TABLE_KEY,
    InitialWeights,
    WarmStartError,
    check_same_shape,
    new_item_rows,
    warm_state_dict,
)
from serving.inputs import vocabulary_remap

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training_fixtures import tiny_config, write_walks  # noqa: E402

BACKENDS = ["torch"] + ([] if torchrec_unavailable() else ["torchrec"])
CFG = dict(d_model=8, n_heads=2, n_layers=1, max_len=8, time_gap_buckets=4, learnable_slopes=True)


def _vocabulary(ids: list[str]) -> pl.DataFrame:
    return pl.DataFrame({schema.ITEM_IDX: pl.Series(range(1, len(ids) + 1), dtype=pl.Int32), schema.ITEM_ID: ids})


def _trained(cfg: ModelConfig, n_items: int, seed: int = 3) -> AlibiRanker:
    """A model whose every weight is random (not its init), as after training."""
    torch.manual_seed(seed)
    model = AlibiRanker(cfg, n_items)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn_like(param) * 0.7 + 0.3)
    return model


@pytest.mark.parametrize("old_backend", BACKENDS)
@pytest.mark.parametrize("new_backend", BACKENDS)
def test_shared_items_keep_their_rows_bit_for_bit_by_raw_id_at_other_indices(old_backend, new_backend):
    old_cfg = ModelConfig(**CFG, embedding_backend=old_backend)
    new_cfg = ModelConfig(**{**CFG, "max_len": 12, "dropout": 0.4}, embedding_backend=new_backend)  # free to differ
    old_ids = ["a", "b", "c", "d", "e"]
    new_ids = ["e", "x", "c", "a", "y", "z", "d"]  # b dropped; a, c, d, e at other indices; x, y, z new
    old = _trained(old_cfg, len(old_ids))
    remap, unknown = vocabulary_remap(_vocabulary(new_ids), _vocabulary(old_ids))
    assert unknown == 3 and remap.tolist() == [0, 5, 0, 3, 1, 0, 0, 4]

    state = warm_state_dict(old.state_dict(), remap, old_cfg, new_cfg, seed=11)
    new = AlibiRanker(new_cfg, len(new_ids))
    new.load_state_dict(state, strict=True)  # every key and shape of the new model

    old_table, table = old.items.weight.detach(), new.items.weight.detach()
    assert table.shape == (8, 8)
    for new_idx, item in enumerate(new_ids, start=1):
        if item in old_ids:
            assert torch.equal(table[new_idx], old_table[old_ids.index(item) + 1]), item
    assert torch.equal(table[0], old_table[0])  # padding row
    # new rows: mean + population std of the trained rows 1..5 times the seeded normal draw (hand reference)
    trained = old_table[1:].double().numpy()
    z = torch.randn(3, 8, generator=torch.Generator().manual_seed(11)).double().numpy()
    expected = trained.mean(axis=0) + trained.std(axis=0, ddof=0) * z
    np.testing.assert_allclose(table[[2, 5, 6]].double().numpy(), expected, rtol=1e-6, atol=1e-6)
    # every other weight (blocks, norms, learnable slopes, the time-gap table) is the old one
    old_state = old.state_dict()
    others = [key for key in old_state if key != ITEM_TABLE_KEY]
    assert any("time_gap_table" in key for key in others) and any("slopes" in key for key in others)
    for key in others:
        assert torch.equal(new.state_dict()[key], old_state[key]), key
    assert state[others[0]].data_ptr() != old_state[others[0]].data_ptr()  # copies, not shared


def test_new_rows_have_the_trained_rows_mean_and_spread():
    torch.manual_seed(0)
    trained = torch.randn(400, 6) * torch.tensor([0.1, 0.5, 1.0, 2.0, 0.3, 0.7]) + torch.tensor([1.0, -2, 0, 0.5, 3, -1])
    rows = new_item_rows(trained, 20_000, seed=5)
    assert rows.shape == (20_000, 6) and rows.dtype == torch.float32
    np.testing.assert_allclose(rows.mean(0).numpy(), trained.mean(0).numpy(), atol=0.03)
    np.testing.assert_allclose(rows.std(0).numpy(), trained.std(0, correction=0).numpy(), rtol=0.03)
    assert torch.equal(rows, new_item_rows(trained, 20_000, seed=5))  # seeded
    assert new_item_rows(trained, 0, seed=5).shape == (0, 6)


def test_same_vocabulary_is_an_exact_copy():
    cfg = ModelConfig(**CFG, embedding_backend="torch")
    old = _trained(cfg, 5)
    state = warm_state_dict(old.state_dict(), np.arange(6), cfg, cfg, seed=0)
    assert all(torch.equal(state[key], value) for key, value in old.state_dict().items())


@pytest.mark.parametrize(
    "change",
    [{"d_model": 16}, {"n_layers": 2}, {"n_heads": 4}, {"position": "learned", "learnable_slopes": False},
     {"time_gap_buckets": 0},
     {"slopes": "wide"}, {"ffn_mult": 2}, {"learnable_slopes": False}, {"free_heads": 1}, {"lowpass_window": 3}],
)  # fmt: skip
def test_another_architecture_is_refused_naming_the_key(change):
    old_cfg = ModelConfig(**CFG, embedding_backend="torch")
    new_cfg = ModelConfig(**{**CFG, **change}, embedding_backend="torch")
    old = _trained(old_cfg, 5)
    with pytest.raises(WarmStartError) as err:
        warm_state_dict(old.state_dict(), np.arange(6), old_cfg, new_cfg, seed=0, source="runs:/r1/model")
    message = str(err.value)
    key = next(iter(change))
    assert "\n" not in message and message.startswith("cannot warm-start from runs:/r1/model: it is another model")
    assert f"model.{key}={getattr(old_cfg, key)} (now {change[key]})" in message


def test_learned_positions_need_the_same_max_len():
    learned = dict(CFG, position="learned", learnable_slopes=False)
    check_same_shape(ModelConfig(**learned), ModelConfig(**{**learned, "dropout": 0.5}))
    with pytest.raises(WarmStartError, match=r"model.max_len=8 \(now 16\)"):
        check_same_shape(ModelConfig(**learned), ModelConfig(**{**learned, "max_len": 16}))


class _FirstStepWeights(L.Callback):
    """The item table and first block's weights as the first training step sees them."""

    def __init__(self) -> None:
        self.seen: dict[str, torch.Tensor] | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.seen is None:
            self.seen = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}


def test_fit_starts_from_the_warm_weights_before_the_first_step(tmp_path):
    from recsys_alibi.training.datamodule import SequenceDataModule
    from recsys_alibi.training.fit import fit_ranker

    config = tiny_config(tmp_path / "job", "train.max_epochs=1", "model.embedding_backend=torch")
    prepared = write_walks(tmp_path / "prepared", n_users=40)
    datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
    state = _trained(config.model, datamodule.n_items, seed=9).state_dict()
    probe = _FirstStepWeights()
    fit_ranker(config, datamodule, tmp_path / "ckpt", None, callbacks=[InitialWeights(state), probe], progress=False)
    assert probe.seen is not None and set(probe.seen) == set(state)
    for key, value in state.items():
        assert torch.equal(probe.seen[key], value), key
