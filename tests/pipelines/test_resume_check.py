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
