"""``model.max_len: auto``: the training window from the users' history lengths (training/data_rules.py)."""

from __future__ import annotations

import numpy as np
import pytest
from training_fixtures import tiny_config, write_walks

from recsys_alibi.config import ConfigError, load_config
from recsys_alibi.model.transformer import AlibiRanker
from recsys_alibi.training.data_rules import max_len_from_lengths, resolve_max_len


@pytest.mark.parametrize(
    ("lengths", "quantile", "cap", "expected"),
    [
        (np.arange(1, 401), 0.75, 200, 200),  # 75 % quantile 300.25 -> 300, capped at 200
        (np.arange(1, 401), 0.75, 1000, 300),
        (np.full(7, 8), 0.75, 200, 50),  # short Amazon-style histories: at least 50
        (np.full(3, 126), 0.75, 200, 150),  # 126 / 50 = 2.52 -> 3 steps of 50
        (np.full(3, 124), 0.75, 200, 100),  # 2.48 -> 2
        (np.array([10, 20, 30, 1000]), 1.0, 5000, 1000),  # quantile 1: the longest history
        (np.full(3, 500), 0.75, 30, 30),  # a cap below 50 wins
    ],
)  # fmt: skip
def test_max_len_from_lengths(lengths, quantile, cap, expected):
    assert max_len_from_lengths(lengths, quantile, cap) == expected


def test_no_history_is_an_error():
    with pytest.raises(ValueError, match="at least one user"):
        max_len_from_lengths(np.array([], dtype=np.int64))


def test_auto_is_resolved_from_the_fit_lengths_and_a_number_is_kept(tmp_path):
    prepared = write_walks(tmp_path / "prepared")  # histories of 3..29 events
    auto = resolve_max_len(tiny_config(tmp_path, "model.max_len=auto", "model.max_len_cap=20"), prepared)
    assert auto.model.max_len == 20  # 75 % quantile ~ 21 events -> 50 -> the cap
    fixed = tiny_config(tmp_path)
    assert resolve_max_len(fixed, prepared) is fixed and fixed.model.max_len == 16


def test_auto_is_a_config_value_but_not_a_model():
    config = load_config(None, ["model.max_len=auto"])
    assert config.model.max_len == "auto"
    with pytest.raises(ValueError, match="max_len=auto is set from the training data"):
        AlibiRanker(config.model, n_items=10)
    with pytest.raises(ConfigError, match="model.max_len"):
        load_config(None, ["model.max_len=long"])
    with pytest.raises(ConfigError, match="model.max_len_quantile"):
        load_config(None, ["model.max_len_quantile=0"])


def test_diagnose_asks_for_a_number_when_max_len_is_auto():
    from pipelines.diagnose import run_diagnose

    with pytest.raises(ConfigError, match="--max-len"):
        run_diagnose(load_config(None, ["model.max_len=auto"]))


def test_the_gpu_fit_benchmark_resolves_the_recipe_rule(tmp_path):
    """benchmarks/gpu_fit.py builds its data module itself: it must resolve ``max_len: auto`` as ``train`` does."""
    import json

    from benchmark_scripts import BENCHMARKS, load_benchmark
    from training_fixtures import NO_ITEM_TABLE, TINY

    gpu_fit = load_benchmark("gpu_fit")
    prepared = write_walks(tmp_path / "prepared")
    overrides = [*TINY, *NO_ITEM_TABLE, "model.max_len=auto", "train.max_epochs=1"]
    sets = [arg for item in overrides for arg in ("--set", item)]
    out = tmp_path / "fit.json"
    gpu_fit.main(["--config", str(BENCHMARKS.parent / "configs" / "default.yaml"), "--prepared", str(prepared),
                  "--output", str(tmp_path / "fit"), "--json", str(out), *sets])  # fmt: skip
    assert json.loads(out.read_text())["epochs"] == 1


def _long_histories(path, n_users=20, n_events=300):
    """A prepared dir of ``n_users`` histories of ``n_events`` events, timestamps 0 .. n_events - 1."""
    import polars as pl

    from recsys_alibi.data import schema

    path.mkdir(parents=True)
    pl.DataFrame({
        schema.USER_ID: pl.Series(range(n_users), dtype=pl.Int64),
        schema.ITEM_IDX: pl.Series([[1 + (u + t) % 40 for t in range(n_events)] for u in range(n_users)],
                                   dtype=pl.List(pl.Int32)),
        schema.TIMESTAMP: pl.Series([list(range(n_events))] * n_users, dtype=pl.List(pl.Int64)),
        schema.LENGTH: pl.Series([n_events] * n_users, dtype=pl.Int32),
    }).write_parquet(path / schema.SEQUENCES_FILE)  # fmt: skip
    pl.DataFrame({
        schema.ITEM_IDX: pl.Series(range(1, 41), dtype=pl.Int32), schema.ITEM_ID: pl.Series(range(101, 141)),
        schema.COUNT: pl.Series([1] * 40, dtype=pl.Int64),
    }).write_parquet(path / schema.ITEMS_FILE)  # fmt: skip
    return path


def test_auto_follows_the_protocol_s_fit_prefix(tmp_path):
    prepared = _long_histories(tmp_path / "prepared")
    cap = ["model.max_len=auto", "model.max_len_cap=1000"]
    # leave-one-out: 299 events may be used -> 300; temporal with cutoff 151: the 151 events before it -> 150
    assert resolve_max_len(tiny_config(tmp_path, *cap), prepared).model.max_len == 300
    temporal = tiny_config(tmp_path, *cap, "evaluate.protocol=temporal", "evaluate.temporal_cutoff=151")
    assert resolve_max_len(temporal, prepared).model.max_len == 150
