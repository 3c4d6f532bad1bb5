"""The embedded synthetic log: determinism, schema, and the structure it promises."""

from __future__ import annotations

import time

import numpy as np
import polars as pl
import pytest

from recsys_alibi.config import GenerateConfig
from recsys_alibi.data.synthetic import (
    EPISODE_GAP,
    LongRangeCatalog,
    _default_items,
    _TopicCatalog,
    _with_taste,
    generate_events,
    long_range_catalog,
)


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
    assert counts[0] > 4 * np.median(counts)  # head well above the median item (measured 5.1x, seed 7)
    top = counts[: len(counts) // 10].sum() / counts.sum()
    assert top > 0.17  # the top 10% of items hold more than 10% of the events (measured 0.204: the taste
    # events consume the catalog without repeats, which flattens the counts of heavy users)


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


def test_topic_interests_drift():
    """The topic draws (the events that are not taste events) move from a start to an end mixture."""

    def jaccard(a: np.ndarray, b: np.ndarray) -> float:
        sa, sb = set(a.tolist()), set(b.tolist())
        return len(sa & sb) / len(sa | sb)

    rng = np.random.default_rng(7)
    lengths = np.full(300, 400)
    items = _default_items(lengths, _TopicCatalog(1000, rng), rng)
    long = np.split(items, np.cumsum(lengths)[:-1])
    # first vs last quarter of a history, against two interleaved quarters of the same size
    ends = np.mean([jaccard(h[: len(h) // 4], h[-(len(h) // 4) :]) for h in long])
    interleaved = np.mean([jaccard(h[0::4], h[1::4]) for h in long])
    assert ends < 0.85 * interleaved  # early and late interests differ more than chance splits


def _taste_events(seed: int, lengths: list[int], n_items: int = 1000):
    """The taste events `_with_taste` writes over a block whose other events are marked -1."""
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n_items, 16))
    lengths = np.array(lengths)
    out = _with_taste(np.full(int(lengths.sum()), -1), lengths, vectors, rng)
    bounds = np.cumsum(np.concatenate([[0], lengths]))
    return vectors, out, [out[a:b][out[a:b] >= 0] for a, b in zip(bounds[:-1], bounds[1:])]


def test_taste_events_consume_one_order_per_user_without_repeats():
    _, out, (short, long) = _taste_events(0, [600, 2000])
    assert 0.77 < (out >= 0).mean() < 0.83  # TASTE_SHARE = 0.8 of 2,600 events (binomial sd 0.008)
    assert len(set(short.tolist())) == short.size  # no item twice among a user's taste events
    assert long.size > 1000 and (long[: long.size - 1000] == long[1000:]).all()  # after N the order starts again
    assert len(set(long[:1000].tolist())) == 1000  # the first N taste events cover the catalog once


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_taste_is_stable_over_the_history(seed):
    """Early taste items match the taste estimated from late ones: the far past predicts the future."""
    vectors, _, (history,) = _taste_events(seed, [600])
    late_taste = vectors[history[100:]].mean(axis=0)  # (K,) estimate from taste events 100..
    affinity = vectors @ late_taste  # (N,)
    percentile = (affinity[None, :] < affinity[history[:20], None]).mean()
    assert percentile > 0.85  # the first 20 lie in the top 15 % of the catalog (measured 0.90-0.98; chance 0.5)


def test_most_test_targets_are_not_repeats(default_log):
    """The last event (the test target) is new to the user for most users: the taste never repeats."""
    new = [h[-1] not in set(h[:-1].tolist()) for h in _histories(default_log)]
    assert np.mean(new) > 0.6


def _roles(h: np.ndarray, cat: LongRangeCatalog) -> str:
    """One letter per event: A/B cue, a/b answer, T trigger, . filler."""
    role = np.full(h.shape[0], ".")
    for letter, ids in (("A", cat.cues_a), ("B", cat.cues_b), ("a", cat.answers_a), ("b", cat.answers_b)):
        role[np.isin(h, ids)] = letter
    role[h == cat.trigger] = "T"
    return "".join(role)


def test_long_range_catalog_roles_are_disjoint_and_cover_the_catalog():
    cat = long_range_catalog(301, seed=3)
    parts = [np.array([cat.trigger]), cat.cues_a, cat.cues_b, cat.answers_a, cat.answers_b, cat.fillers]
    assert [len(p) for p in parts] == [1, 1, 50, 1, 50, 198]  # one cue of kind a, 50 of kind b
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(1, 302))  # disjoint, cover 1..N
    assert np.array_equal(cat.f(cat.cues_b[[4, 0]]), cat.answers_b[[4, 0]])
    assert np.array_equal(long_range_catalog(301, seed=3).cues_a, cat.cues_a)
    with pytest.raises(ValueError, match="cues only"):
        cat.f(cat.fillers[:1])
    with pytest.raises(ValueError, match=">= 7"):
        long_range_catalog(6, seed=0)


def test_long_range_probe_answers_are_f_of_the_cue_d_back():
    d, gap = 16, EPISODE_GAP
    cfg = GenerateConfig(task="long-range", distance=d, users=40, items=61, min_events=20, max_events=300)
    df = generate_events(cfg, seed=0)
    cat = long_range_catalog(61, seed=0)
    episode = "AB" + "." * (d - 3) + "Tab" + "." * (gap - 2)  # one period, P = D + gap events
    for h in _histories(df):
        n = len(h)
        assert n >= 2 * d + gap + 2
        roles = _roles(h, cat)
        # episodes laid back from the end; the part before the first whole episode is fillers
        k = (n - d - 2) // (d + gap) + 1
        assert roles == "." * (n - k * (d + gap) + gap - 2) + (episode * k)[: -(gap - 2)]
        answers = np.flatnonzero(np.isin(h, np.concatenate([cat.answers_a, cat.answers_b])))
        assert np.array_equal(h[answers], cat.f(h[answers - d]))  # every answer is f(event D back)
        assert roles[-2:] == "ab" and roles[-3] == "T"  # validation and test targets are answers
        window = roles[: n - 2][-(2 * d + gap) :]  # training window of max_len = 2D + gap - 1 inputs
        assert window.startswith("AB") and window.count("ab") == 1  # holds one whole episode
    assert len({int(h[-1]) for h in _histories(df)}) >= 8  # the test answer varies: its predecessor cannot tell it
    assert df.equals(generate_events(cfg, seed=0))
    with pytest.raises(ValueError, match="distance"):
        generate_events(GenerateConfig(task="long-range", distance=2, items=61), seed=0)
