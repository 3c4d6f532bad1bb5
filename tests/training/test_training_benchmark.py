"""``benchmarks/training.py`` runs with only torch, Lightning, pyarrow, numpy and pydantic (the GPU box).

torchrec, fbgemm-gpu, MLflow and polars are hidden from the import system in a subprocess; the
ML-1M-shaped data is a prepared directory written with pyarrow.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from without_modules import run_without
from benchmark_scripts import load_benchmark

bench = load_benchmark("training", "training_benchmark")


def _prepared(path: Path, lengths: list[int], n_items: int = 50) -> Path:
    rng = np.random.default_rng(0)
    path.mkdir(parents=True)
    items = pa.array([rng.integers(1, n_items + 1, n).astype(np.int32).tolist() for n in lengths], pa.list_(pa.int32()))
    pq.write_table(pa.table({"user_id": pa.array(range(len(lengths))), "item_idx": items}), path / "sequences.parquet")
    pq.write_table(pa.table({"item_idx": pa.array(range(1, n_items + 1), pa.int32())}), path / "items.parquet")
    return path


def test_epoch_tokens_count_each_training_window_once(tmp_path):
    # leave-one-out training histories drop the last two events and users with < 4 events
    histories, n_items, _ = bench.train_histories(_prepared(tmp_path / "p", [3, 5, 12, 303]))
    assert n_items == 50 and histories.lengths().tolist() == [3, 10, 301]
    # windows of max_len = the last max_len + 1 events: max_len supervised positions at most
    assert bench.epoch_tokens(histories, 200) == 2 + 9 + 200
    assert bench.epoch_tokens(histories, 4) == 2 + 4 + 4


def test_benchmark_runs_without_torchrec_mlflow_or_polars(tmp_path):
    prepared = _prepared(tmp_path / "p", [30] * 40)
    out = tmp_path / "bench.json"
    args = ["--device", "cpu", "--prepared", str(prepared), "--lengths", "16", "1024", "--backends", "flex", "sdpa",
            "--steps", "2", "--warmup", "1", "--batch-size", "8", "--tokens-per-step", "2048", "--json", str(out)]  # fmt: skip
    run_without("torchrec,fbgemm_gpu,mlflow,polars", "-m", "benchmarks.training", *args)
    cases = {(c["max_len"], c["backend"]): c for c in json.loads(out.read_text())["cases"]}
    assert set(cases) == {(16, "flex"), (16, "sdpa"), (1024, "flex"), (1024, "sdpa")}
    assert "no backward on the CPU" in cases[(16, "flex")]["skipped"]
    short, long = cases[(16, "sdpa")], cases[(1024, "sdpa")]
    assert "error" not in short and "error" not in long
    assert short["ml1m_epoch_tokens"] == 40 * 16  # 28-event histories: 17-event windows, 16 targets each
    assert long["tokens"] == 2 * 2 * 1024 and long["rows_per_step"] == 2.0  # 2 steps of 2 full rows
    assert short["tokens_per_second"] > 0 and abs(short["seconds_per_ml1m_epoch"] * short["tokens_per_second"] - 640) < 1e-6
