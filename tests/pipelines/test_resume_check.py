"""``train --resume`` refuses another model but not another backend for the same weights."""

from __future__ import annotations

import pytest

from pipelines.resume import check_same_model
from recsys_alibi.config import ConfigError, load_config
from recsys_alibi.tracking import param_values


def test_resume_takes_another_item_table_or_attention_backend_but_not_another_model(tmp_path):
    logged = param_values(load_config(overrides=["model.embedding_backend=torchrec"]).model_dump())
    last = tmp_path / "last.ckpt"
    # the same state dict in either item table (docs/install.md): switching on resume is fine
    check_same_model(load_config(overrides=["model.embedding_backend=torch", "model.attention_backend=sdpa"]),
                      logged, last)  # fmt: skip
    with pytest.raises(ConfigError, match=r"model\.d_model=64 \(now 32\)"):
        check_same_model(load_config(overrides=["model.d_model=32"]), logged, last)


def test_resume_refuses_another_learning_rate_or_loss_but_takes_more_epochs_and_processes(tmp_path):
    # the checkpoint's optimiser state kept train.lr=0.001 over --set train.lr=0.01 without a word
    logged = param_values(load_config().model_dump())
    last = tmp_path / "last.ckpt"
    check_same_model(load_config(overrides=["train.max_epochs=40", "train.devices=2", "train.strategy=ddp",
                                            "train.max_minutes=30", "train.precision=bf16-mixed"]), logged, last)  # fmt: skip
    with pytest.raises(ConfigError) as info:
        check_same_model(load_config(overrides=["train.lr=0.01", "train.loss=bce"]), logged, last)
    assert str(info.value) == (
        f"cannot resume {last}: its run trained with other training settings (train.loss=softmax (now bce), "
        "train.lr=0.001 (now 0.01)); resume with the same model.* and train.* settings (epochs, minutes and processes "
        "may change), or remove that checkpoint directory to start a new run")
