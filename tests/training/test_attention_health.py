"""Attention entropy / zero-weight share (hand-computed values) and the AttentionHealth callback."""

from __future__ import annotations

import logging
import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from recsys_alibi.config import ModelConfig, TrainConfig
from recsys_alibi.training.attention_health import (
    AttentionHealth,
    attention_entropy,
    health_metrics,
    visible_pairs,
    zero_weight_share,
)
from recsys_alibi.training.module import RankerModule


def test_entropy_of_two_equal_weights_is_ln2():
    w = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])  # (B=1, H=1, L=2, L=2)
    valid = torch.tensor([[True, True]])
    assert attention_entropy(w, valid)[0].item() == pytest.approx(math.log(2) / 2)  # rows: 0 and ln 2
    only_second = torch.tensor([[False, True]])  # rows are query positions: keep row 1 only
    assert attention_entropy(w, only_second)[0].item() == pytest.approx(math.log(2))


def test_entropy_per_head_hand_values():
    # head 0: uniform over 4 keys in the last row; head 1: one-hot rows; padding row ignored
    w = torch.zeros(1, 2, 4, 4)
    w[0, 0, 3] = 0.25
    w[0, 0, :3, 0] = 1.0
    w[0, 1, :, 0] = 1.0
    w[0, 0, 2] = torch.tensor([0.2, 0.3, 0.5, 0.0])
    valid = torch.ones(1, 4, dtype=torch.bool)
    row2 = -(0.2 * math.log(0.2) + 0.3 * math.log(0.3) + 0.5 * math.log(0.5))
    expected0 = (0 + 0 + row2 + math.log(4)) / 4
    ent = attention_entropy(w, valid)
    assert ent.dtype == torch.float64
    assert ent.tolist() == pytest.approx([expected0, 0.0])
    with pytest.raises(ValueError, match="B, H, L, L"):
        attention_entropy(torch.ones(2, 2))


def test_zero_weight_share_counts_only_visible_valid_pairs():
    # one row of length 3 padded to 4; causal pairs among valid positions: 1 + 2 + 3 = 6
    w = torch.tensor(
        [[[[1.0, 0.0, 0.0, 0.0],
           [0.0, 1.0, 0.0, 0.0],  # (1, 0) is an exact zero
           [0.5, 0.5, 0.0, 0.0],  # (2, 2) is an exact zero
           [0.0, 0.0, 0.0, 0.0]]]]  # padding row: not counted
    )  # fmt: skip
    valid = torch.tensor([[True, True, True, False]])
    assert zero_weight_share(w, valid).tolist() == pytest.approx([2 / 6])
    # with a window of 1 only the diagonal is visible: (2, 2) is the one zero of 3
    vis = visible_pairs(torch.tensor([3]), 4, window=1)
    assert zero_weight_share(w, visible=vis).tolist() == pytest.approx([1 / 3])


def test_visible_pairs_window_and_sinks():
    vis = visible_pairs(torch.tensor([5, 2]), 5, window=2, sinks=1)[:, 0]  # (B, L, L)
    assert vis[0, 4].tolist() == [True, False, False, True, True]  # sink 0, then keys 3, 4
    assert vis[1].sum() == 3 and not vis[1, 2:].any()  # row of length 2


def test_health_metrics_names_are_mlflow_safe():
    w = torch.full((1, 2, 3, 3), 1 / 3).tril()
    metrics = health_metrics([w, w], torch.tensor([3]))
    assert set(metrics) == {f"attn/l{l}_h{h}_{k}" for l in (0, 1) for h in (0, 1) for k in ("entropy", "zero_share")}
    assert metrics["attn/l1_h0_zero_share"] == 0.0


def _batches(n_items: int, length: int, rows: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    items = torch.randint(1, n_items + 1, (rows, length + 1), generator=gen)
    lengths = torch.full((rows,), length)
    lengths[-1] = length // 2  # one padded row
    inputs = items[:, :-1].clone()
    targets = items[:, 1:].clone()
    for b, n in enumerate(lengths.tolist()):
        inputs[b, n:] = 0
        targets[b, n:] = 0
    train = [{"inputs": inputs, "targets": targets, "lengths": lengths}]
    val = [{"history": inputs, "lengths": lengths, "targets": items[:, -1], "seen": inputs}]
    return train, val


def test_callback_logs_metrics_and_warns_once_per_head(caplog):
    torch.manual_seed(0)
    length, n_items = 260, 40
    # max_bias 2 with 2 heads: slopes 1/2 and 1/4; in fp32 head 0 loses keys beyond ~206 items
    model_cfg = ModelConfig(d_model=8, n_heads=2, n_layers=1, max_len=length, max_bias=2.0,
                            dropout=0.0, attention_backend="sdpa")  # fmt: skip
    train_cfg = TrainConfig(max_epochs=2, batch_size=4, warmup_steps=0)
    module = RankerModule(model_cfg, train_cfg, n_items, torch.ones(n_items + 1, dtype=torch.int64))
    train, val = _batches(n_items, length, rows=4, seed=0)
    health = AttentionHealth(zero_share_threshold=0.02, max_rows=3)
    trainer = L.Trainer(
        max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, callbacks=[health],
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="recsys_alibi.training.attention_health"):
        trainer.fit(module, DataLoader(train, batch_size=None), DataLoader(val, batch_size=None))
    assert health.batch is not None and health.batch["history"].shape == (3, length)
    for key in ("attn/l0_h0_entropy", "attn/l0_h1_entropy", "attn/l0_h0_zero_share", "attn/l0_h1_zero_share"):
        assert key in trainer.callback_metrics and key in health.last
    assert health.last["attn/l0_h0_zero_share"] > 0.02  # steep head: blind beyond ~206 items
    assert health.last["attn/l0_h1_zero_share"] == 0.0
    assert 0 < health.last["attn/l0_h1_entropy"] < math.log(length)
    warnings = [r for r in caplog.records if "head 0" in r.getMessage()]
    assert len(warnings) == 1 and health.warned == {(0, 0)}  # two validation epochs, one warning


def test_callback_rejects_bad_threshold():
    with pytest.raises(ValueError, match="threshold"):
        AttentionHealth(zero_share_threshold=1.5)


def test_the_watched_rows_are_the_first_validation_users_not_the_longest(tmp_path):
    """Validation batches come longest first (train.batch_tokens); the callback still watches the
    first users of the validation set in its own order, as with batches in dataset order."""
    from recsys_alibi.training.attention_health import first_rows
    from recsys_alibi.training.datamodule import SequenceDataModule
    from tests.training.training_fixtures import tiny_config, write_walks

    prepared = write_walks(tmp_path / "prepared")
    config = tiny_config(tmp_path / "out", "train.batch_tokens=64", "model.max_len=40")  # windows = histories
    loader = SequenceDataModule(prepared, config.model, config.train, config.seed).val_dataloader()
    watched = first_rows(loader, 3)
    expected = [loader.dataset[i] for i in range(3)]  # (window, target, seen) of the first 3 users
    assert watched["lengths"].tolist() == [len(w) for w, _, _ in expected]
    assert watched["targets"].tolist() == [t for _, t, _ in expected]
    assert int(next(iter(loader))["lengths"].max()) > int(watched["lengths"].max())  # the loader's first: the longest
    assert first_rows(DataLoader([{"history": torch.ones(1, 2)}], batch_size=None), 3)["history"].shape == (1, 2)
