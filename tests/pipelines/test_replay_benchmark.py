"""benchmarks/replay.py: next-period examples by hand, and a whole tiny replay writing every field."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from recsys_alibi.config import DataConfig
from recsys_alibi.data.prepare import prepare

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("replay_benchmark", REPO / "benchmarks" / "replay.py")
replay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replay)

DAY = replay.DAY
TINY = [
    "model.d_model=8", "model.n_heads=2", "model.n_layers=1", "model.max_len=8", "model.attention_backend=sdpa",
    "train.max_epochs=1", "train.batch_size=16", "train.warmup_steps=1", "train.attention_health=false",
    "train.warm.max_epochs=1", "data.min_events_per_user=1", "data.min_events_per_item=1", "evaluate.batch_size=64",
]  # fmt: skip


def _log(n_users: int = 40, n_items: int = 30, days: int = 70) -> pl.DataFrame:
    """Users walking a catalog, one event every 5 days each (staggered), over ``days`` days; 5 more users
    arrive on day 40 and walk 10 items of their own (new users and new items on later steps)."""
    rng = np.random.default_rng(0)
    rows = []
    for u in range(n_users + 5):
        late = u >= n_users
        start, first, catalog = int(rng.integers(0, n_items)), (40 * DAY if late else 0) + u * 3600, 10 if late else n_items
        for t, ts in enumerate(range(first, days * DAY, 5 * DAY)):
            rows.append((u, (start + t) % catalog + 1 + (100 if late else 0), ts))
    return pl.DataFrame(rows, schema=["user_id", "item_id", "timestamp"], orient="row")


def _test_users(log: pl.DataFrame, lo: int, hi: int) -> int:
    """Reference: users with a next-period event on an item of the catalog before ``lo`` they have not seen."""
    rows = sorted(log.rows(), key=lambda r: r[2])
    catalog = {item for _, item, ts in rows if ts < lo}
    seen: dict[int, set] = {}
    for user, item, ts in rows:
        if ts < lo:
            seen.setdefault(user, set()).add(item)
    return len({u for u, item, ts in rows if lo <= ts < hi and u in seen and item in catalog and item not in seen[u]})


def test_next_period_target_is_the_first_unseen_catalog_event(tmp_path):
    events = pl.DataFrame(
        {"user_id": [1, 1, 1, 1, 1, 1, 2, 2, 2, 3], "item_id": [10, 11, 10, 99, 12, 13, 11, 12, 14, 10],
         "timestamp": [1, 2, 10, 11, 12, 13, 3, 4, 30, 20]}
    )  # fmt: skip
    history = events.filter(pl.col("timestamp") < 10)
    history.write_parquet(tmp_path / "h.parquet")
    prepare(DataConfig(min_events_per_user=1, min_events_per_item=1), tmp_path / "h.parquet", tmp_path / "p")
    examples = replay.next_period_examples(tmp_path / "p", events, 10, 20, model=None)
    items = pl.read_parquet(tmp_path / "p" / "items.parquet")
    idx = dict(zip(items["item_id"].to_list(), items["item_idx"].to_list()))
    # user 1: 10 (seen) and 99 (not in the catalog) are passed over, 12 is the target; user 2: nothing
    # in [10, 20) (its event at 30 is later); user 3: no history before 10
    assert examples["user_id"].to_list() == [1]
    assert examples["history"].to_list() == [[idx[10], idx[11]]] and examples["targets"].to_list() == [[idx[12]]]


def test_boundaries_cover_the_log_in_whole_periods():
    ts = np.array([0, 10 * DAY, 20 * DAY, 100 * DAY])
    assert replay.boundaries(ts, 0.5, 30) == [15 * DAY, 45 * DAY, 75 * DAY, 105 * DAY]


def test_tiny_replay_writes_every_field(tmp_path, monkeypatch, one_torch_thread):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    _log().write_parquet(tmp_path / "log.parquet")
    args = ["--config", str(REPO / "configs" / "default.yaml"), "--input", str(tmp_path / "log.parquet"),
            "--format", "parquet", "--start", "0.5", "--period-days", "14", "--steps", "1", "--workdir", "work",
            "--output", "replay.json"]  # fmt: skip
    for item in TINY:
        args += ["--set", item]
    replay.main(args)
    result = json.loads((tmp_path / "replay.json").read_text())
    assert (tmp_path / "replay.png").stat().st_size > 0
    steps = result["steps"]
    assert [s["step"] for s in steps] == [1]
    log = _log()
    bounds = replay.boundaries(log["timestamp"].to_numpy(), 0.5, 14)
    for k, step in enumerate(steps, start=1):
        before, now = log.filter(pl.col("timestamp") < bounds[k - 1]), log.filter(pl.col("timestamp") < bounds[k])
        assert step["new_events"] == now.height - before.height
        assert step["new_users"] == now["user_id"].n_unique() - before["user_id"].n_unique()
        assert step["new_items"] == now["item_id"].n_unique() - before["item_id"].n_unique()
        assert step["test_users"] == _test_users(log, bounds[k], bounds[k + 1]) >= 40
        for name in ("scratch", "warm"):
            assert set(step[name]) == {"NDCG@10", "HR@10", "train_seconds"}
            assert 0 <= step[name]["NDCG@10"] <= step[name]["HR@10"] <= 1
        low, high = step["ci95"]
        assert low <= step["difference"] <= high
        assert abs(step["difference"] - (step["warm"]["NDCG@10"] - step["scratch"]["NDCG@10"])) < 1e-12
    pooled = result["pooled_difference_NDCG@10"]  # one step: the pooled pairs are that step's
    assert pooled["pairs"] == steps[0]["test_users"]
    assert pooled["difference"] == pytest.approx(steps[0]["difference"], abs=1e-12)
    assert pooled["ci95"][0] <= pooled["difference"] <= pooled["ci95"][1]
    assert steps[0]["new_users"] == 5 and steps[0]["new_items"] > 0  # the late users and their items
    assert steps[0]["period_end"] == dt.datetime.fromtimestamp(bounds[1], dt.timezone.utc).date().isoformat()
