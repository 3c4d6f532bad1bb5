"""``train.precision``: Lightning's older names under their new ones, and float16 on a CPU run said in one line."""

from __future__ import annotations

import logging

import pytest
import torch

from recsys_alibi.config import load_config
from recsys_alibi.training import launch


def _train(*overrides: str):
    return load_config(None, ["train.accelerator=cpu", *overrides]).train


@pytest.mark.parametrize(("given", "handed"), [("16", "16-mixed"), ("'16'", "16-mixed"), ("bf16", "bf16-mixed"),
                                               ("32", "32-true"), ("'32'", "32-true")])  # fmt: skip
def test_older_names_reach_lightning_under_their_new_ones(monkeypatch, given, handed):
    monkeypatch.setattr(launch, "on_cpu", lambda accelerator: False)  # 16-mixed as on a GPU
    monkeypatch.setattr(launch, "native_bf16", lambda accelerator: True)
    assert launch.resolve_precision(_train(f"train.precision={given}")) == handed


@pytest.mark.parametrize(("native", "said"), [
    (True, "train.precision=16-mixed: float16 mixed precision needs a GPU; this CPU run uses bf16-mixed"),
    (False, "train.precision=16-mixed: float16 mixed precision needs a GPU; this CPU run uses bf16-mixed (emulated on "
            "this CPU: several times slower than float32; train.precision=auto picks 32-true here)"),
])  # fmt: skip
def test_float16_on_a_cpu_run_is_bf16_said_in_one_line(monkeypatch, caplog, native, said):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    with caplog.at_level(logging.INFO, logger=launch.__name__):
        assert launch.resolve_precision(_train("train.precision=16-mixed")) == "bf16-mixed"
    assert [r.getMessage() for r in caplog.records] == [said]
