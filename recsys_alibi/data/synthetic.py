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
    * **re-consumption from the distant past**: with probability ``REPEAT_P`` a topic draw repeats
      the topic item of an earlier event of the same user drawn uniformly from the whole past;
    * **a long-term taste beside the short-term topics** (the signal that lies far back): every
      item has a fixed latent vector ``v_i`` (``TASTE_DIM`` normal entries) and every user a
      taste ``u`` (normal, variance ``1 / TASTE_DIM`` per entry). Each event is, with
      probability ``TASTE_SHARE``, a *taste event* instead of the topic draw above: the user's
      taste events consume the catalog in one Plackett-Luce order of the affinities
      ``TASTE_BETA * u . v_i - TASTE_TILT * log(i)`` (item ``i = 1..N``; drawn with Gumbel
      noise, Luce 1959, Plackett 1975), so the k-th taste event is the user's k-th favourite
      still unconsumed, never a repeat (after ``N`` taste events the order starts again). The
      next taste event is predictable only from the taste ``u``, and every taste event of the
      history is one noisy look at it: the last 50 events estimate ``u`` from about 40 looks,
      the whole history from hundreds, which is what makes the whole history worth reading.

``"long-range"``
    A probe of context length D = ``cfg.distance`` (>= 3): can the model see an event exactly
    D events back? The catalog is split once (:func:`long_range_catalog`) into disjoint roles:
    one *trigger* item, ``A_CUES`` (1) cue of kind a, ``C = (N - 1) // 6`` cues of kind b (50
    for N = 301), one *answer* per cue (``f`` is a fixed bijection from cues onto answers) and
    the rest *fillers*. A history is uniform random filler events with *episodes* laid
    backwards from its last event every ``P = D + EPISODE_GAP`` events. An episode whose last
    event is at ``a`` holds::

        a - D - 1: cue_a                        a - 2: the trigger
        a - D:     cue_b (uniform from cues_b)  a - 1: f(cue_a)     a: f(cue_b)

    so every answer equals ``f`` of the event exactly D back, and since ``P > D`` that cue is
    the most recent cue of its kind. Episodes that do not fit before the first event are left
    out (their places are fillers). The last two events of every history (the leave-one-out
    validation and test targets) are answers. The test answer ``f(cue_b)`` follows
    ``f(cue_a)``, so its kind is known from the previous event; which of the C answers it is
    only from the cue D back. A model that cannot see that far ranks the C answers alike
    (HR@10 ``10 / C``, 0.2 with C = 50); content attention to the one cue of kind b in sight is
    all it needs to be right. (The validation answer has a single candidate: with one cue of
    kind a, ``f(cue_a)`` is the fixed item that marks the place of the test answer, which makes
    the test retrieval learnable in minutes on a CPU; validation measures nothing about range.)
    Histories are at least ``max(cfg.min_events, 2 * D + EPISODE_GAP + 2)`` long, so that the
    events before the last two hold one whole episode: a training window of ``model.max_len >=
    2 * D + EPISODE_GAP - 1`` holds the cues and answers of one episode.

**Daily files** (:func:`split_days`, ``generate --days N``): the same log cut into N periods of
equal time (``day-001`` ... ``day-N``), for a job that runs once per period on the day's events.
Users arrive over time by construction (each starts at a random time). Items arrive too:
``LATE_ITEM_SHARE`` of the catalog (drawn at random, seeded) is released at a time drawn uniformly
between the end of day 1 and the end of the log, and a late item's events before its release are
dropped (the user never saw it). So day 1 holds most of the catalog and every later day brings
new users and new items.

Timestamps are integer seconds: each user starts at a random time in the first half of 2024
and events follow with strictly positive log-normal gaps (median ~10 minutes, long tail), so
a user's timestamps are strictly increasing. Everything is vectorised with numpy (no Python
loop over users or events) and processed in blocks of users to bound memory.
"""

from __future__ import annotations

from dataclasses import dataclass

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
EPISODE_GAP = 8  # long-range probe: episodes repeat every distance + EPISODE_GAP events
TASTE_SHARE = 0.8  # probability that an event of the default task follows the long-term taste
TASTE_DIM = 16  # dimensions of the latent item vectors and user tastes
TASTE_BETA = 3.0  # strength of the taste in the affinities (larger: more concentrated)
TASTE_TILT = 0.5  # popularity tilt of the affinities: -TASTE_TILT * log(item id)
TASTE_BLOCK = 4_000_000  # user x item affinities held at once (bounds peak memory)
LATE_ITEM_SHARE = 0.2  # daily files: share of the catalog released after day 1
A_CUES = 1  # long-range probe: cues of kind a (its answer is the query of kind b: one learns fast)


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
    catalog, sampler = None, None
    if cfg.task == "long-range":
        catalog = long_range_catalog(cfg.items, seed)  # checks items and distance first
        if cfg.distance < 3:
            raise ValueError(f"generate.distance must be >= 3 for task long-range, got {cfg.distance}")
    lengths = _history_lengths(cfg, rng)
    if catalog is None:
        sampler = _TopicCatalog(cfg.items, rng)
        vectors = rng.normal(size=(cfg.items, TASTE_DIM))  # (N, K) latent item vectors, fixed for the log

    frames: list[pl.DataFrame] = []
    first_user = 0
    while first_user < cfg.users:
        # a block of users holding about BLOCK_EVENTS events
        cum = np.cumsum(lengths[first_user:])
        n_block = max(1, int(np.searchsorted(cum, BLOCK_EVENTS, side="right")))
        block_lengths = lengths[first_user : first_user + n_block]
        if catalog is not None:
            items = _long_range_items(block_lengths, cfg.distance, catalog, rng)
        else:
            items = _with_taste(_default_items(block_lengths, sampler, rng), block_lengths, vectors, rng)
        frames.append(_block_frame(first_user, block_lengths, items, rng))
        first_user += n_block
    return pl.concat(frames, rechunk=True)


def _history_lengths(cfg: GenerateConfig, rng: np.random.Generator) -> np.ndarray:
    """Log-normal history lengths clipped to the configured bounds, (users,) int64."""
    lo = cfg.min_events
    if cfg.task == "long-range":
        lo = max(lo, 2 * cfg.distance + EPISODE_GAP + 2)  # one whole episode before the last two events
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


def _with_taste(items: np.ndarray, lengths: np.ndarray, vectors: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Replace a block's taste events by each user's Plackett-Luce order, (E,) int64 -> (E,) int64.

    ``items`` are item indices (id - 1) of the block's events, ``vectors`` (N, K) the latent item
    vectors. Each event becomes a taste event with probability ``TASTE_SHARE``; the k-th taste
    event of a user is entry ``k mod N`` of that user's order (the indices sorted by affinity
    plus Gumbel noise, descending). Users are ordered ``TASTE_BLOCK // N`` at a time.
    """
    n_items = vectors.shape[0]
    user, _, starts = _user_offsets(lengths)
    taste = rng.random(user.shape[0]) < TASTE_SHARE  # (E,) bool
    before = np.cumsum(taste) - taste  # taste events before each event, over the block
    rank = before - before[starts][user]  # k: taste events of the same user before it
    tastes = rng.normal(size=(lengths.shape[0], TASTE_DIM)) / np.sqrt(TASTE_DIM)  # (U, K)
    tilt = -TASTE_TILT * np.log(np.arange(1, n_items + 1))  # (N,)
    items = items.copy()
    step = max(1, TASTE_BLOCK // n_items)
    ends = np.append(starts, user.shape[0])  # events of users first..last - 1: ends[first]:ends[last]
    for first in range(0, lengths.shape[0], step):
        last = min(first + step, lengths.shape[0])
        affinity = TASTE_BETA * tastes[first:last] @ vectors.T + tilt  # (u, N)
        order = np.argsort(-(affinity + rng.gumbel(size=affinity.shape)), axis=1)  # (u, N) item indices
        lo, hi = ends[first], ends[last]
        here = lo + np.flatnonzero(taste[lo:hi])  # the taste events of these users
        items[here] = order[user[here] - first, rank[here] % n_items]
    return items


@dataclass(frozen=True, eq=False)
class LongRangeCatalog:
    """The roles of the catalog in the long-range probe; every array holds item ids (1..N).

    Attributes:
        trigger: the item right before every first answer of an episode.
        cues_a, cues_b: (A,) and (C,) int64 cues of the two kinds.
        answers_a, answers_b: (A,) and (C,) int64; ``f(cues_a[i]) = answers_a[i]``, same for ``b``.
        fillers: (F,) int64 every other item.
    """

    trigger: int
    cues_a: np.ndarray
    cues_b: np.ndarray
    answers_a: np.ndarray
    answers_b: np.ndarray
    fillers: np.ndarray

    def f(self, cues: np.ndarray) -> np.ndarray:
        """The answer of each cue, (E,) int64 item ids -> (E,) int64 item ids.

        Raises:
            ValueError: an id is not a cue.
        """
        n_items = 1 + 2 * (self.cues_a.shape[0] + self.cues_b.shape[0]) + self.fillers.shape[0]
        table = np.zeros(n_items + 1, dtype=np.int64)  # item id -> answer id, 0: not a cue
        table[self.cues_a] = self.answers_a
        table[self.cues_b] = self.answers_b
        cues = np.asarray(cues, dtype=np.int64)
        if cues.size and (cues.min() < 0 or cues.max() >= table.shape[0] or (table[cues] == 0).any()):
            raise ValueError("f is defined on cues only")
        return table[cues]


def long_range_catalog(items: int, seed: int) -> LongRangeCatalog:
    """Split items 1..N into the roles of the long-range probe, the same for every user.

    One trigger, ``A = min(A_CUES, C)`` cues of kind a and ``C = (N - 1) // 6`` of kind b, one
    answer per cue, and the remaining ``N - 1 - 2A - 2C >= 2C`` items as fillers, assigned in a
    random order drawn from ``seed`` (its own stream: the split depends on ``(items, seed)``
    only).

    Args:
        items: catalog size N, >= 7.
        seed: as ``generate_events``.

    Returns:
        A :class:`LongRangeCatalog` whose roles are disjoint and cover 1..N.

    Raises:
        ValueError: ``items < 7``.

    Example:
        >>> cat = long_range_catalog(301, seed=0)
        >>> len(cat.cues_a), len(cat.cues_b), len(cat.answers_b), len(cat.fillers)
        (1, 50, 50, 198)
    """
    if items < 7:
        raise ValueError(f"generate.items must be >= 7 for task long-range (trigger, cues, answers, fillers), got {items}")
    b = (items - 1) // 6
    a = min(A_CUES, b)
    order = np.random.default_rng([seed, 1]).permutation(items).astype(np.int64) + 1  # item ids
    ends = np.cumsum([1, a, a, b, b])  # trigger | cues_a | answers_a | cues_b | answers_b | fillers
    return LongRangeCatalog(
        trigger=int(order[0]), cues_a=order[ends[0] : ends[1]], answers_a=order[ends[1] : ends[2]],
        cues_b=order[ends[2] : ends[3]], answers_b=order[ends[3] : ends[4]], fillers=order[ends[4] :],
    )  # fmt: skip


def _long_range_items(
    lengths: np.ndarray, distance: int, catalog: LongRangeCatalog, rng: np.random.Generator
) -> np.ndarray:
    """Item index (id - 1) of each event of a block of users of the long-range probe, (E,) int64.

    Events are counted from the end of each history, ``r = n - 1 - t``; episode ``e = r // P``
    (``P = D + EPISODE_GAP``) has its answers at ``r mod P`` in {0, 1}, the trigger at 2 and its
    cues at ``D`` (kind b) and ``D + 1`` (kind a); it is kept when its ``cue_a`` is inside the
    history (``e * P + D + 1 <= n - 1``).
    """
    user, pos, _ = _user_offsets(lengths)
    period = distance + EPISODE_GAP
    n = lengths[user]
    r = n - 1 - pos  # events after this one
    episode, offset = r // period, r % period
    kept = episode * period + distance + 1 <= n - 1
    # one cue draw per (user, episode), shared by the cue and its answer
    per_user = np.maximum((lengths - distance - 2) // period + 1, 0)
    first = np.concatenate([[0], np.cumsum(per_user)[:-1]])
    n_episodes = int(per_user.sum())
    cue_a = rng.integers(0, catalog.cues_a.shape[0], size=n_episodes)
    cue_b = rng.integers(0, catalog.cues_b.shape[0], size=n_episodes)
    items = catalog.fillers[rng.integers(0, catalog.fillers.shape[0], size=user.shape[0])]
    ep = np.where(kept, first[user] + episode, 0)
    for at, values in (
        (distance + 1, catalog.cues_a[cue_a]),
        (distance, catalog.cues_b[cue_b]),
        (1, catalog.answers_a[cue_a]),
        (0, catalog.answers_b[cue_b]),
    ):
        here = kept & (offset == at)
        items[here] = values[ep[here]]
    items[kept & (offset == 2)] = catalog.trigger
    return items - 1


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


def split_days(events: pl.DataFrame, days: int, n_items: int, seed: int) -> list[pl.DataFrame]:
    """Cut a generated log into ``days`` time-ordered periods, releasing items over time (module doc).

    Args:
        events: a log of :func:`generate_events` (``item_id`` 1..``n_items``, ``timestamp`` seconds).
        days: number of periods P >= 1, each ``(max - min + 1) / P`` seconds long (the last one
            ends at the last event).
        n_items: catalog size N of the log.
        seed: the log's seed; the late items and their release times come from its own stream
            (``default_rng([seed, 2])``), so the days depend on ``(log, days, seed)`` only.

    Returns:
        P frames with the columns of ``events``, in its row order; day ``d`` holds the kept events
        with ``edges[d] <= timestamp < edges[d + 1]``. With P = 1 the whole log, nothing dropped.

    Raises:
        ValueError: ``days < 1`` or an empty log.

    Example:
        >>> log = generate_events(GenerateConfig(users=30, items=40, max_events=50), seed=0)
        >>> [day.height > 0 for day in split_days(log, 3, 40, seed=0)]
        [True, True, True]
    """
    if days < 1:
        raise ValueError(f"generate.days must be >= 1, got {days}")
    if events.height == 0:
        raise ValueError("the log has no events to cut into days")
    ts = events.get_column(TIMESTAMP).to_numpy()
    edges = np.linspace(ts.min(), ts.max() + 1, days + 1)  # (P + 1,) float seconds
    release = np.full(n_items + 1, -np.inf)  # item id -> release time
    if days > 1:
        rng = np.random.default_rng([seed, 2])
        late = rng.choice(np.arange(1, n_items + 1), size=round(LATE_ITEM_SHARE * n_items), replace=False)
        release[late] = rng.uniform(edges[1], edges[-1], size=late.shape[0])
    kept = ts >= release[events.get_column(ITEM_ID).to_numpy()]
    day = np.clip(np.searchsorted(edges, ts, side="right") - 1, 0, days - 1)
    return [events.filter(pl.Series(kept & (day == d))) for d in range(days)]
