"""The embedded synthetic log: determinism, schema, and the structure it promises."""

from __future__ import annotations


import numpy as np
import polars as pl
import pytest

from recsys_alibi.config import GenerateConfig
from recsys_alibi.data.synthetic import (
    EPISODE_GAP,
    TASTE_DIM,
    LongRangeCatalog,
    _default_items,
    _first_consumptions,
    _TopicCatalog,
    _with_taste,
    generate_events,
    latent_items,
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
    assert default_log["item_id"].min() >= 1 and default_log["item_id"].max() <= 2000


def test_events_per_user_on_average():
    df = generate_events(GenerateConfig(users=2000), seed=0)
    assert 150 < df.height / 2000 < 300  # ~172 events per user on average (20..2000, median ~124)


def test_history_lengths_spread_between_bounds(default_log):
    lengths = default_log.group_by("user_id").len()["len"]
    assert lengths.min() >= 20 and lengths.max() <= 2000
    assert (lengths >= 1000).sum() >= 5  # some users with more than a thousand events (16, seed 7)
    assert lengths.median() < lengths.mean()  # long right tail


def test_time_order_and_grouping(default_log):
    ok = default_log.select(
        (pl.col("timestamp").diff().over("user_id") > 0).fill_null(True).all(),
        (pl.col("user_id").diff().fill_null(0) >= 0).all(),
    ).row(0)
    assert ok == (True, True)


def test_power_law_popularity(default_log):
    counts = default_log["item_id"].value_counts(sort=True)["count"].to_numpy()
    assert counts[0] > 3 * np.median(counts)  # head well above the median item (measured 3.8x, seed 7)
    top = counts[: len(counts) // 10].sum() / counts.sum()
    assert top > 0.17  # the top 10% of items hold more than 10% of the events (measured 0.183: the taste
    # events consume the catalog without repeats, which flattens the counts of heavy users)


def test_no_user_consumes_an_item_twice_in_a_catalog_larger_than_histories(default_log):
    """Under the seen-item rule a repeat target is a miss: the default data has none."""
    assert all(len(set(h.tolist())) == len(h) for h in _histories(default_log))


def test_a_small_catalog_comes_back_only_after_a_whole_cycle():
    """Histories longer than the catalog keep their length: items return once the taste order restarts."""
    cfg = GenerateConfig(users=30, items=20, min_events=20, max_events=200)
    df = generate_events(cfg, seed=3)
    lengths = df.group_by("user_id", maintain_order=True).len()["len"].to_numpy()
    rng = np.random.default_rng(3)
    from recsys_alibi.data.synthetic import _history_lengths

    assert np.array_equal(lengths, _history_lengths(cfg, rng))  # every history has its drawn length
    for h in _histories(df):
        assert len(set(h[:10].tolist())) == 10  # the first events are all new
    assert any(len(set(h.tolist())) < len(h) for h in _histories(df))  # 20 items: longer histories repeat


def test_first_consumptions_drop_repeats_within_a_cycle_and_keep_the_wanted_length():
    items = np.array([3, 1, 3, 2, 1, 4,  5, 5, 6, 7])  # two users: 6 and 4 drafted events
    cycle = np.array([0, 0, 0, 0, 1, 1,  0, 0, 0, 0])  # user 1's item 1 comes again in its second cycle
    kept, lengths = _first_consumptions(items, cycle, np.array([6, 4]), np.array([5, 2]))
    assert kept.tolist() == [3, 1, 2, 1, 4, 5, 6] and lengths.tolist() == [5, 2]
    kept, lengths = _first_consumptions(items, cycle, np.array([6, 4]), np.array([6, 4]))
    assert kept.tolist() == [3, 1, 2, 1, 4, 5, 6, 7] and lengths.tolist() == [5, 3]  # short drafts: fewer


def test_latent_items_depend_on_catalog_and_seed_only():
    latent = latent_items(1000, seed=7)
    assert latent.vectors.shape == (1000, TASTE_DIM) and latent.vectors.dtype == np.float64
    assert np.bincount(latent.topic).tolist() == [50] * 20  # round robin: 20 topics of 50 items
    assert sorted(latent.topic_rank[latent.topic == 4].tolist()) == list(range(1, 51))
    again = latent_items(1000, seed=7)
    assert np.array_equal(again.vectors, latent.vectors) and np.array_equal(again.topic, latent.topic)
    assert not np.array_equal(latent_items(1000, seed=8).vectors, latent.vectors)
    # the log's taste events follow these vectors: a user's items lie along one direction
    df = generate_events(GenerateConfig(users=50, items=1000, min_events=300, max_events=400), seed=7)
    first, second = _histories(df)[0][:150] - 1, _histories(df)[0][150:300] - 1
    cos = latent.vectors[first].mean(0) @ latent.vectors[second].mean(0)
    cos /= np.linalg.norm(latent.vectors[first].mean(0)) * np.linalg.norm(latent.vectors[second].mean(0))
    assert cos > 0.8  # two halves of one history agree on the taste (measured 0.88; chance: about 0)


def test_topic_interests_drift():
    """The topic draws (the events that are not taste events) move from a start to an end mixture."""

    def jaccard(a: np.ndarray, b: np.ndarray) -> float:
        sa, sb = set(a.tolist()), set(b.tolist())
        return len(sa & sb) / len(sa | sb)

    rng = np.random.default_rng(7)
    lengths = np.full(300, 400)
    items = _default_items(lengths, _TopicCatalog(latent_items(1000, seed=7)), rng)
    long = np.split(items, np.cumsum(lengths)[:-1])
    # first vs last quarter of a history, against two interleaved quarters of the same size
    ends = np.mean([jaccard(h[: len(h) // 4], h[-(len(h) // 4) :]) for h in long])
    interleaved = np.mean([jaccard(h[0::4], h[1::4]) for h in long])
    assert ends < 0.85 * interleaved  # early and late interests differ more than chance splits


def _taste_events(seed: int, lengths: list[int], n_items: int = 1000):
    """The taste events `_with_taste` writes over a block whose other events are marked -1."""
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n_items, TASTE_DIM))
    lengths = np.array(lengths)
    out, _ = _with_taste(np.full(int(lengths.sum()), -1), lengths, vectors, rng)
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
    assert percentile > 0.85  # the first 20 lie in the top 15 % of the catalog (measured 0.95-0.98; chance 0.5)


def test_most_test_targets_are_not_repeats(default_log):
    """Every test target (the last event) is new to its user: the seen-item rule never turns one into a miss
    (the old generator's re-consumed topic items made 10.8 % of them misses)."""
    new = [h[-1] not in set(h[:-1].tolist()) for h in _histories(default_log)]
    assert np.mean(new) == 1.0


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


def _oracle_hit_rates(df: pl.DataFrame, vectors: np.ndarray, contexts: tuple, last: int = 5) -> dict:
    """HR@10 of an oracle that knows the item vectors: it estimates the taste as the mean vector
    of the context (the last ``c`` events, ``None``: all earlier ones) and ranks the unseen items
    by their dot product with it; each user's last ``last`` events are the targets."""
    hits = dict.fromkeys(contexts, 0)
    n = 0
    for h in _histories(df):
        h = h - 1  # item indices
        for t in range(len(h) - last, len(h)):
            past, target = h[:t], h[t]
            seen = np.zeros(vectors.shape[0], dtype=bool)
            seen[past] = True
            for c in contexts:
                scores = vectors @ vectors[past if c is None else past[-c:]].mean(axis=0)  # (N,)
                scores[seen] = -np.inf
                hits[c] += int((scores > scores[target]).sum() < 10)
            n += 1
    return {c: h / n for c, h in hits.items()}


def test_long_range_signal_a_whole_history_oracle_beats_one_limited_to_the_last_50_events(monkeypatch):
    """The reason the default data exists: the next event is better predicted from every earlier
    event than from the last 50. Removing the taste (all events topic draws) removes the gap."""
    cfg = GenerateConfig(users=120, items=2000, min_events=400, max_events=800)
    vectors = latent_items(2000, seed=11).vectors
    rates = _oracle_hit_rates(generate_events(cfg, seed=11), vectors, (50, None))
    assert rates[None] > rates[50] + 0.04 and rates[None] > 2 * rates[50]  # measured 0.113 against 0.032
    # (600 targets, TASTE_BETA 6; seeds 12 and 13: 0.140 against 0.032, 0.103 against 0.028)
    monkeypatch.setattr("recsys_alibi.data.synthetic.TASTE_SHARE", 0.0)
    flat = _oracle_hit_rates(generate_events(cfg, seed=11), vectors, (50, None))
    assert flat[None] < 0.03 and flat[50] < 0.03  # no taste: about chance
