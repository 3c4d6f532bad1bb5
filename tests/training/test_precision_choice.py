"""``train.precision=auto``: bfloat16 only where the device multiplies it natively."""

from __future__ import annotations

import logging

import pytest
import torch

from recsys_alibi.config import load_config
from recsys_alibi.training import launch


def _train(*overrides: str):
    return load_config(None, ["train.accelerator=cpu", *overrides]).train


@pytest.mark.parametrize(("avx512_bf16", "amx", "expected"), [(False, False, "32-true"), (True, False, "bf16-mixed"),
                                                               (False, True, "bf16-mixed")])  # fmt: skip
def test_auto_is_bf16_only_on_a_cpu_with_native_bfloat16(monkeypatch, avx512_bf16, amx, expected):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert launch.resolve_precision(_train("train.precision=auto")) == expected


def test_explicit_bf16_on_a_cpu_without_it_is_kept_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    with caplog.at_level(logging.WARNING, logger=launch.__name__):
        assert launch.resolve_precision(_train("train.precision=bf16-mixed")) == "bf16-mixed"
        assert launch.resolve_precision(_train("train.precision=32-true")) == "32-true"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "without native bfloat16" in warnings[0] and "train.precision=auto" in warnings[0]


def test_the_recipes_ask_for_auto():
    from pathlib import Path

    for name in ("movielens-1m", "movielens-100k", "beauty"):
        path = Path(__file__).resolve().parents[2] / "configs" / f"{name}.yaml"
        assert load_config(str(path), []).train.precision == "auto", name
