"""The embedded synthetic log: determinism, schema, and the structure it promises."""

from __future__ import annotations

import time

import numpy as np
import polars as pl
import pytest

from recsys_alibi.config import GenerateConfig
from recsys_alibi.data.synthetic import generate_events


@pytest.fixture(scope="module")
def default_log() -> pl.DataFrame:
    return generate_events(GenerateConfig(), seed=7)


def _histories(df: pl.DataFrame) -> list[np.ndarray]:
    return [np.asarray(x) for x in df.group_by("user_id", maintain_order=True).agg("item_id")["item_id"].to_list()]


def test_schema_and_determinism(default_log):
    assert default_log.schema == pl.Schema(
        {"user_id": pl.Int64, "item_id": pl.Int64, "timestamp": pl.Int64, "event_type": pl.String}
    )
    assert default_log.equals(generate_events(GenerateConfig(), seed=7))
    assert not default_log.equals(generate_events(GenerateConfig(), seed=8))
    assert default_log["user_id"].n_unique() == 2000
    assert default_log["item_id"].min() >= 1 and default_log["item_id"].max() <= 1000


def test_fast_enough():
    start = time.perf_counter()
    df = generate_events(GenerateConfig(users=2000), seed=0)
    assert time.perf_counter() - start < 5.0
    assert 150 < df.height / 2000 < 300  # ~200 events per user on average


def test_history_lengths_spread_between_bounds(default_log):
    lengths = default_log.group_by("user_id").len()["len"]
    assert lengths.min() >= 20 and lengths.max() <= 3000
    assert (lengths >= 1000).sum() >= 5  # some users with thousands of events
    assert lengths.median() < lengths.mean()  # long right tail


def test_time_order_and_grouping(default_log):
    ok = default_log.select(
        (pl.col("timestamp").diff().over("user_id") > 0).fill_null(True).all(),
        (pl.col("user_id").diff().fill_null(0) >= 0).all(),
    ).row(0)
    assert ok == (True, True)


def test_power_law_popularity(default_log):
    counts = default_log["item_id"].value_counts(sort=True)["count"].to_numpy()
    assert counts[0] > 20 * np.median(counts) / 2  # head much above the median item
    top = counts[: len(counts) // 10].sum() / counts.sum()
    assert top > 0.3  # the top 10% of items hold far more than 10% of the events


def test_reconsumption_from_the_distant_past(default_log):
    far = total = 0
    for h in _histories(default_log):
        last_seen: dict[int, int] = {}
        for t, item in enumerate(h.tolist()):
            if item in last_seen and t - last_seen[item] >= 50:
                far += 1
            last_seen[item] = t
        total += len(h)
    assert far / total > 0.05


def test_interests_drift(default_log):
    def jaccard(a: np.ndarray, b: np.ndarray) -> float:
        sa, sb = set(a.tolist()), set(b.tolist())
        return len(sa & sb) / len(sa | sb)

    long = [h for h in _histories(default_log) if len(h) >= 300]
    # first vs last quarter of a history, against two interleaved quarters of the same size
    ends = np.mean([jaccard(h[: len(h) // 4], h[-(len(h) // 4) :]) for h in long])
    interleaved = np.mean([jaccard(h[0::4], h[1::4]) for h in long])
    assert ends < 0.85 * interleaved  # early and late interests differ more than chance splits


def test_long_range_probe_is_a_function_of_the_event_d_back():
    cfg = GenerateConfig(task="long-range", distance=16, users=50, items=200, min_events=20, max_events=200)
    df = generate_events(cfg, seed=0)
    answer: dict[int, int] = {}
    successors: dict[int, set[int]] = {}
    for h in _histories(df):
        assert len(h) >= 16 + 8
        for t in range(16, len(h)):
            assert answer.setdefault(int(h[t - 16]), int(h[t])) == int(h[t])  # the same f for everyone
        for t in range(1, len(h)):
            successors.setdefault(int(h[t - 1]), set()).add(int(h[t]))
    assert np.mean([len(s) for s in successors.values()]) > 3  # the previous event does not predict
    assert df.equals(generate_events(cfg, seed=0))
