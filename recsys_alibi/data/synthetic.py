"""The embedded default data: a seeded synthetic behaviour log.

Two tasks (``GenerateConfig.task``):

``"default"``
    A log with the structure that makes long histories worth modelling:

    * **power-law popularity**: items belong to ``N_TOPICS`` latent topics; inside a topic the
      item of popularity rank ``r`` is drawn with probability proportional to ``r ** -ZIPF_A``;
    * **interest drift**: each user has a start and an end mixture over topics (Dirichlet);
      the topic of the event at relative position ``w`` in the history is drawn from
      ``(1 - w) * start + w * end``, so interests move slowly over the history;
    * **long-tailed history lengths**: log-normal between ``cfg.min_events`` and
      ``cfg.max_events`` (median ``min * (max / min) ** 0.4``; with the defaults 20..3000 the
      mean is ~200 events and about 1% of users have more than 1,000);
    * **re-consumption from the distant past**: with probability ``REPEAT_P`` an event repeats
      the item of an earlier event of the same user drawn uniformly from the whole past, so the
      far context carries signal that a short window misses.

``"long-range"``
    A probe of context length: a fixed random permutation ``f`` of the catalog and a distance
    ``D = cfg.distance``. The first ``D`` events of a user are uniform random items; every later
    event is ``item[t] = f(item[t - D])``. The ``D - 1`` events in between belong to other,
    independent chains, so they are distractors: nothing but the event exactly ``D`` steps back
    (or a multiple of ``D``) predicts the next item, and a model that cannot see ``D`` events
    back is at chance. Histories are at least ``max(cfg.min_events, D + max(8, D // 2))`` long.

Timestamps are integer seconds: each user starts at a random time in the first half of 2024
and events follow with strictly positive log-normal gaps (median ~10 minutes, long tail), so
a user's timestamps are strictly increasing. Everything is vectorised with numpy (no Python
loop over users or events) and processed in blocks of users to bound memory.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from recsys_alibi.config import GenerateConfig
from recsys_alibi.data.schema import EVENT_TYPE, ITEM_ID, TIMESTAMP, USER_ID

N_TOPICS = 20  # latent interest clusters of the default task
ZIPF_A = 1.1  # popularity exponent inside a topic
DIRICHLET_ALPHA = 0.2  # concentration of a user's topic mixture (small: a few topics per user)
REPEAT_P = 0.2  # probability that an event re-consumes an item of the user's past
LENGTH_SIGMA = 0.85  # spread of log history length
START_TIME = 1_704_067_200  # 2024-01-01T00:00:00Z
START_SPREAD = 182 * 86_400  # users start within the first half of 2024
GAP_LOG_MEDIAN = np.log(600.0)  # median gap between events: 10 minutes
GAP_LOG_SIGMA = 1.5
EVENT_TYPES = ("click", "view", "add_to_cart", "purchase")
EVENT_TYPE_P = (0.70, 0.20, 0.07, 0.03)
BLOCK_EVENTS = 4_000_000  # events generated per block of users (bounds peak memory)


def generate_events(cfg: GenerateConfig, seed: int) -> pl.DataFrame:
    """Generate a synthetic behaviour log; the same ``(cfg, seed)`` gives the same frame.

    Args:
        cfg: users, items, task (``"default"`` or ``"long-range"``), distance, history bounds.
        seed: seed of the numpy generator.

    Returns:
        Canonical events, one row per event, grouped by user and in time order:
        ``user_id`` Int64 (1..users), ``item_id`` Int64 (1..items), ``timestamp`` Int64
        (seconds, UTC), ``event_type`` Utf8.

    Example:
        >>> df = generate_events(GenerateConfig(users=10, items=50), seed=0)
        >>> df.columns
        ['user_id', 'item_id', 'timestamp', 'event_type']
    """
    rng = np.random.default_rng(seed)
    lengths = _history_lengths(cfg, rng)
    if cfg.task == "long-range":
        perm = rng.permutation(cfg.items).astype(np.int64)  # f: item index -> item index
        sampler = None
    else:
        perm = None
        sampler = _TopicCatalog(cfg.items, rng)

    frames: list[pl.DataFrame] = []
    first_user = 0
    while first_user < cfg.users:
        # a block of users holding about BLOCK_EVENTS events
        cum = np.cumsum(lengths[first_user:])
        n_block = max(1, int(np.searchsorted(cum, BLOCK_EVENTS, side="right")))
        block_lengths = lengths[first_user : first_user + n_block]
        if perm is not None:
            items = _long_range_items(block_lengths, cfg.distance, perm, rng)
        else:
            items = _default_items(block_lengths, sampler, rng)
        frames.append(_block_frame(first_user, block_lengths, items, rng))
        first_user += n_block
    return pl.concat(frames, rechunk=True)


def _history_lengths(cfg: GenerateConfig, rng: np.random.Generator) -> np.ndarray:
    """Log-normal history lengths clipped to the configured bounds, (users,) int64."""
    lo = cfg.min_events
    if cfg.task == "long-range":
        lo = max(lo, cfg.distance + max(8, cfg.distance // 2))
    hi = max(cfg.max_events, lo)
    median = lo * (hi / lo) ** 0.4
    raw = rng.lognormal(np.log(median), LENGTH_SIGMA, size=cfg.users)
    return np.clip(np.rint(raw), lo, hi).astype(np.int64)


class _TopicCatalog:
    """Items split over latent topics, Zipf popularity inside each topic.

    ``cum`` holds, topic after topic, ``k + cumulative probability`` so that one
    ``searchsorted(cum, k + u)`` samples an item of topic ``k`` for a uniform ``u``.
    """

    def __init__(self, n_items: int, rng: np.random.Generator) -> None:
        n_topics = min(N_TOPICS, n_items)
        topic_of = np.arange(n_items) % n_topics  # (N,) topic of each item
        order = np.lexsort((rng.random(n_items), topic_of))  # grouped by topic, random rank inside
        topics_sorted = topic_of[order]
        starts = np.searchsorted(topics_sorted, np.arange(n_topics))
        rank = np.arange(n_items) - starts[topics_sorted] + 1  # popularity rank inside topic
        weights = rank.astype(np.float64) ** -ZIPF_A
        totals = np.bincount(topics_sorted, weights=weights, minlength=n_topics)
        # each topic's probabilities sum to 1, so the running sum for topic k lies in (k, k + 1]
        self.cum = np.cumsum(weights / totals[topics_sorted])  # (N,) increasing
        ends = np.searchsorted(topics_sorted, np.arange(n_topics), side="right") - 1
        self.cum[ends] = np.arange(n_topics) + 1.0  # close each topic exactly at k + 1
        self.item_of = order.astype(np.int64)  # position in cum -> item index
        self.n_topics = n_topics

    def sample(self, topics: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One item index per topic in ``topics`` (E,) int64."""
        u = rng.random(topics.shape[0])
        pos = np.searchsorted(self.cum, topics + u, side="right")
        return self.item_of[np.minimum(pos, self.cum.shape[0] - 1)]


def _user_offsets(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(user of each event, position of each event in its history, first event of each user)."""
    n_events = int(lengths.sum())
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    user = np.repeat(np.arange(lengths.shape[0]), lengths)
    pos = np.arange(n_events) - starts[user]
    return user, pos, starts


def _default_items(lengths: np.ndarray, catalog: _TopicCatalog, rng: np.random.Generator) -> np.ndarray:
    """Item index of each event of a block of users, (E,) int64."""
    n_users, k = lengths.shape[0], catalog.n_topics
    user, pos, starts = _user_offsets(lengths)
    # drifting topic mixture: draw from the start mixture with prob 1 - w, else the end one
    mix = rng.dirichlet(np.full(k, DIRICHLET_ALPHA), size=2 * n_users)  # (2U, K)
    cum = np.cumsum(mix, axis=1)
    cum[:, -1] = 1.0
    cum_flat = (np.arange(2 * n_users)[:, None] + cum).ravel()  # row r occupies (r, r + 1]
    w = pos / np.maximum(lengths[user] - 1, 1)
    row = 2 * user + (rng.random(user.shape[0]) < w)
    topic = np.searchsorted(cum_flat, row + rng.random(user.shape[0]), side="right") - row * k
    items = catalog.sample(np.clip(topic, 0, k - 1), rng)

    # re-consumption: event t copies the item of an earlier event t - d, d uniform in 1..t
    src = np.arange(user.shape[0])
    repeat = (rng.random(user.shape[0]) < REPEAT_P) & (pos > 0)
    back = 1 + np.floor(rng.random(int(repeat.sum())) * pos[repeat]).astype(np.int64)
    src[repeat] -= back
    # resolve chains of repeats by pointer jumping (src[t] < t, so this ends in log steps)
    while True:
        nxt = src[src]
        if np.array_equal(nxt, src):
            break
        src = nxt
    del starts
    return items[src]


def _long_range_items(
    lengths: np.ndarray, distance: int, perm: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Item index of each event of the long-range probe: item[t] = perm[item[t - D]], (E,) int64.

    Event ``t`` is the seed ``t mod D`` pushed ``t // D`` times through ``perm``; with the cycle
    decomposition of ``perm`` that is one lookup: ``cycle[(position + steps) mod cycle length]``.
    """
    user, pos, starts = _user_offsets(lengths)
    n_items = perm.shape[0]
    cycle_flat, cycle_start, cycle_len, cycle_of, pos_in_cycle = _cycles(perm)
    seeds = rng.integers(0, n_items, size=int(lengths.sum()))  # only the first D per user are used
    seed = seeds[starts[user] + pos % distance]
    c = cycle_of[seed]
    steps = pos // distance
    return cycle_flat[cycle_start[c] + (pos_in_cycle[seed] + steps) % cycle_len[c]]


def _cycles(perm: np.ndarray) -> tuple[np.ndarray, ...]:
    """Cycle decomposition of a permutation of 0..N-1.

    Returns ``(flat, start, length, cycle_of, position)``: the cycles one after another (so
    that ``perm[flat[i]] == flat[i + 1]`` inside a cycle), each cycle's start and length, and for
    each element its cycle and its position in it.
    """
    n = perm.shape[0]
    cycle_of = np.full(n, -1, dtype=np.int64)
    position = np.zeros(n, dtype=np.int64)
    flat = np.empty(n, dtype=np.int64)
    starts: list[int] = []
    filled = 0
    for first in range(n):  # O(N): each element is visited once
        if cycle_of[first] >= 0:
            continue
        starts.append(filled)
        x, k = first, 0
        while cycle_of[x] < 0:
            cycle_of[x] = len(starts) - 1
            position[x] = k
            flat[filled] = x
            filled += 1
            k += 1
            x = perm[x]
    start = np.asarray(starts, dtype=np.int64)
    length = np.diff(np.append(start, n))
    return flat, start, length, cycle_of, position


def _block_frame(first_user: int, lengths: np.ndarray, items: np.ndarray, rng: np.random.Generator) -> pl.DataFrame:
    """Assemble a block of users' events: ids, timestamps and event types."""
    user, pos, _ = _user_offsets(lengths)
    n = user.shape[0]
    gaps = 1 + np.floor(rng.lognormal(GAP_LOG_MEDIAN, GAP_LOG_SIGMA, size=n)).astype(np.int64)
    start = START_TIME + rng.integers(0, START_SPREAD, size=lengths.shape[0])
    gaps[pos == 0] = 0
    # per-user cumulative sum of gaps = global cumsum minus the sum before the user's first event
    total = np.cumsum(gaps)
    first = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    ts = start[user] + total - total[first][user]
    kinds = rng.choice(len(EVENT_TYPES), size=n, p=EVENT_TYPE_P)
    return pl.DataFrame(
        {
            USER_ID: pl.Series(user + first_user + 1, dtype=pl.Int64),
            ITEM_ID: pl.Series(items + 1, dtype=pl.Int64),
            TIMESTAMP: pl.Series(ts, dtype=pl.Int64),
            EVENT_TYPE: pl.Series(EVENT_TYPES, dtype=pl.String).gather(kinds),
        }
    )
