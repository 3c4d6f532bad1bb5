"""The embedded default data: a seeded synthetic behaviour log.

Two tasks (``GenerateConfig.task``):

``"default"``
    A log with the structure that makes long histories worth modelling, in which no user consumes
    an item twice (as in MovieLens or most shops), so that the seen-item rule of the evaluation
    (``exclude_seen``: seen items are masked) never turns a target into a miss:

    * **a latent catalog** (:func:`latent_items`, its own seeded stream): every item has a fixed
      latent vector ``v_i`` (``TASTE_DIM`` standard normal entries), a topic (one of
      ``N_TOPICS``) and a popularity rank inside its topic;
    * **a long-term taste** (the signal that lies far back): every user has a taste ``u``
      (normal, variance ``1 / TASTE_DIM`` per entry). Each event is, with probability
      ``TASTE_SHARE``, a *taste event*: the user's taste events consume the catalog in one
      Plackett-Luce order of the affinities ``TASTE_BETA * u . v_i`` (drawn with Gumbel noise,
      Luce 1959, Plackett 1975), so the k-th taste event is the user's k-th favourite still
      unconsumed. The next taste event is predictable only from the taste ``u``, and every taste
      event of the history is one noisy look at it: the last 50 events estimate ``u`` from about
      40 looks, the whole history from hundreds, which is what makes the whole history worth
      reading. The catalog (``cfg.items``) should be at least the longest history
      (``cfg.max_events``; the defaults: 2,000 and 2,000), so that no user runs through it and a
      heavy user's next taste events are still chosen by taste, not by what is left;
    * **short-term topics with interest drift** (the recent signal): the other events draw a
      topic from the user's mixture ``(1 - w) * start + w * end`` at relative position ``w`` in
      the drafted history (two Dirichlet draws, so interests move slowly), and inside the topic the item
      of popularity rank ``r`` with probability proportional to ``r ** -ZIPF_A``;
    * **first consumptions only**: each user's events are drafted (``DRAFT_FACTOR`` times the
      history length plus ``DRAFT_EXTRA``), a drafted event whose item the user has already
      consumed is dropped (a topic draw of an item met before, or a taste event whose item came
      earlier as a topic draw), and the first ``n`` remaining events are the history. Only a
      catalog smaller than a history lets items come back: once a user's taste events have run
      through all ``N`` items the order starts again (a new *cycle*), and an item is then new
      again (the history is shorter than ``n`` when even that runs out);
    * **long-tailed history lengths**: ``n`` log-normal between ``cfg.min_events`` and
      ``cfg.max_events`` (median ``min * (max / min) ** 0.4``; with the defaults 20..2000 the
      median is ~124 events, the mean ~172 and about 0.6 % of users have more than 1,000).

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
TASTE_DIM = 24  # dimensions of the latent item vectors and user tastes
TASTE_BETA = 6.0  # strength of the taste in the affinities (larger: more concentrated)
TASTE_USERS = 256  # users whose taste orders are drawn at once (bounds peak memory: 256 x N keys)
DRAFT_FACTOR = 1.5  # default task: events drafted per history event (repeats are dropped from the draft)
DRAFT_EXTRA = 8  # ... plus this many per user
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
    drafted = lengths  # events generated per user before repeats are dropped
    if catalog is None:
        latent = latent_items(cfg.items, seed)
        sampler = _TopicCatalog(latent)
        drafted = np.ceil(DRAFT_FACTOR * lengths).astype(np.int64) + DRAFT_EXTRA

    frames: list[pl.DataFrame] = []
    first_user = 0
    while first_user < cfg.users:
        # a block of users holding about BLOCK_EVENTS drafted events
        cum = np.cumsum(drafted[first_user:])
        n_block = max(1, int(np.searchsorted(cum, BLOCK_EVENTS, side="right")))
        block_lengths = lengths[first_user : first_user + n_block]
        if catalog is not None:
            items = _long_range_items(block_lengths, cfg.distance, catalog, rng)
        else:
            draft = drafted[first_user : first_user + n_block]
            items, cycle = _with_taste(_default_items(draft, sampler, rng), draft, latent.vectors, rng)
            items, block_lengths = _first_consumptions(items, cycle, draft, block_lengths)
        frames.append(_block_frame(first_user, block_lengths, items, rng))
        first_user += n_block
    return pl.concat(frames, rechunk=True)


@dataclass(frozen=True, eq=False)
class LatentItems:
    """The latent structure of the default task's catalog, the same for every user of a log.

    Row ``i - 1`` of each array describes item id ``i`` (1..N).

    Attributes:
        vectors: (N, K) float64 taste vectors ``v_i`` (K = ``TASTE_DIM``, standard normal).
        topic: (N,) int64 topic of each item, 0..T-1 (T = ``min(N_TOPICS, N)``).
        topic_rank: (N,) int64 popularity rank inside its topic, 1 = the most drawn.
    """

    vectors: np.ndarray
    topic: np.ndarray
    topic_rank: np.ndarray


def latent_items(items: int, seed: int) -> LatentItems:
    """The latent catalog of the default task for ``(items, seed)`` (module doc).

    Drawn from its own stream (``default_rng([seed, 3])``), so it depends on the catalog size
    and seed only, not on the number of users or their histories: a reader of the log (item
    features, an oracle) can rebuild it.

    Args:
        items: catalog size N >= 1.
        seed: the log's seed, as ``generate_events``.

    Returns:
        A :class:`LatentItems`; topics are assigned round-robin over a random permutation, so
        every topic holds ``N // T`` or ``N // T + 1`` items with ranks 1, 2, ...

    Example:
        >>> latent = latent_items(50, seed=0)
        >>> latent.vectors.shape, int(latent.topic.max()), int(latent.topic_rank.max())
        ((50, 24), 19, 3)
    """
    rng = np.random.default_rng([seed, 3])
    vectors = rng.normal(size=(items, TASTE_DIM))  # (N, K)
    n_topics = min(N_TOPICS, items)
    perm = rng.permutation(items)  # item index at each place of the round-robin
    topic = np.empty(items, dtype=np.int64)
    topic_rank = np.empty(items, dtype=np.int64)
    topic[perm] = np.arange(items) % n_topics
    topic_rank[perm] = np.arange(items) // n_topics + 1
    return LatentItems(vectors=vectors, topic=topic, topic_rank=topic_rank)


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

    def __init__(self, latent: LatentItems) -> None:
        n_topics = int(latent.topic.max()) + 1
        order = np.lexsort((latent.topic_rank, latent.topic))  # grouped by topic, by rank inside
        topics_sorted = latent.topic[order]
        weights = latent.topic_rank[order].astype(np.float64) ** -ZIPF_A
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
    """Topic draw (item index) of each event of a block of users, (E,) int64."""
    n_users, k = lengths.shape[0], catalog.n_topics
    user, pos, _ = _user_offsets(lengths)
    # drifting topic mixture: draw from the start mixture with prob 1 - w, else the end one
    mix = rng.dirichlet(np.full(k, DIRICHLET_ALPHA), size=2 * n_users)  # (2U, K)
    cum = np.cumsum(mix, axis=1)
    cum[:, -1] = 1.0
    cum_flat = (np.arange(2 * n_users)[:, None] + cum).ravel()  # row r occupies (r, r + 1]
    w = pos / np.maximum(lengths[user] - 1, 1)
    row = 2 * user + (rng.random(user.shape[0]) < w)
    topic = np.searchsorted(cum_flat, row + rng.random(user.shape[0]), side="right") - row * k
    return catalog.sample(np.clip(topic, 0, k - 1), rng)


def _with_taste(
    items: np.ndarray, lengths: np.ndarray, vectors: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Replace a block's taste events by each user's Plackett-Luce order.

    ``items`` (E,) int64 are item indices (id - 1) of the block's events, ``vectors`` (N, K) the
    latent item vectors. Each event becomes a taste event with probability ``TASTE_SHARE``; the
    k-th taste event of a user is entry ``k mod N`` of that user's order (the indices sorted by
    affinity plus Gumbel noise, descending). Users are ordered ``TASTE_USERS`` at a time, in the
    order of their taste event counts, and only as far into their order as the most taste events
    of a user among them (the rest of the order is never read).

    Returns:
        ``(items, cycle)``, both (E,) int64: the new item indices, and for each event the pass
        through the user's order it belongs to, ``k // N`` with k the taste events of the user
        before it (a taste event counts itself).
    """
    n_users, n_items = lengths.shape[0], vectors.shape[0]
    user, _, starts = _user_offsets(lengths)
    taste = rng.random(user.shape[0]) < TASTE_SHARE  # (E,) bool
    before = np.cumsum(taste) - taste  # taste events before each event, over the block
    rank = before - before[starts][user]  # k: taste events of the same user before it
    tastes = rng.normal(size=(n_users, TASTE_DIM)) / np.sqrt(TASTE_DIM)  # (U, K)
    need = np.minimum(np.bincount(user[taste], minlength=n_users), n_items)  # (U,) entries read
    by_need = np.argsort(need, kind="stable")
    slot = np.empty(n_users, dtype=np.int64)  # user -> its row in the group being ordered
    items = items.copy()
    here = np.flatnonzero(taste)  # the taste events, grouped below by their user's group
    group_of = np.empty(n_users, dtype=np.int64)
    group_of[by_need] = np.arange(n_users) // TASTE_USERS
    here = here[np.argsort(group_of[user[here]], kind="stable")]
    bounds = np.searchsorted(group_of[user[here]], np.arange(group_of.max(initial=0) + 2))
    for g, first in enumerate(range(0, n_users, TASTE_USERS)):
        rows = by_need[first : first + TASTE_USERS]  # (u,) users of this group
        m = int(need[rows].max())
        if m == 0:
            continue
        keys = np.empty((rows.shape[0], n_items), dtype=np.float32)  # (u, N): -(affinity + Gumbel noise)
        rng.random(out=keys, dtype=np.float32)
        with np.errstate(divide="ignore"):  # a uniform draw of exactly 0 ranks its item last
            np.log(np.negative(np.log(keys, out=keys), out=keys), out=keys)  # log(-log U) = -Gumbel
        keys -= TASTE_BETA * tastes[rows] @ vectors.T
        if m < n_items:  # the m smallest keys of each row, then sorted: the first m entries of the order
            top = np.argpartition(keys, m - 1, axis=1)[:, :m]  # (u, m)
            order = np.take_along_axis(top, np.argsort(np.take_along_axis(keys, top, axis=1), axis=1), axis=1)
        else:
            order = np.argsort(keys, axis=1)  # (u, N) item indices
        slot[rows] = np.arange(rows.shape[0])
        ev = here[bounds[g] : bounds[g + 1]]
        items[ev] = order[slot[user[ev]], rank[ev] % n_items]
    return items, rank // n_items


def _first_consumptions(
    items: np.ndarray, cycle: np.ndarray, drafted: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Drop the drafted events that repeat an item of the same user and cycle; keep ``lengths``.

    Args:
        items: (E,) int64 item indices of the drafted events, users one after another.
        cycle: (E,) int64 pass through the user's taste order of each event (:func:`_with_taste`).
        drafted: (U,) int64 drafted events per user, summing to E.
        lengths: (U,) int64 history length wanted per user.

    Returns:
        ``(items, kept)``: the item indices of the kept events, users one after another, and
        (U,) int64 events kept per user, ``min(lengths, first consumptions in the draft)``.
    """
    user, _, _ = _user_offsets(drafted)
    key = (user * (int(cycle.max(initial=0)) + 1) + cycle) * (int(items.max(initial=0)) + 1) + items
    _, first = np.unique(key, return_index=True)  # stable: the first event of each (user, cycle, item)
    new = np.zeros(key.shape[0], dtype=bool)
    new[first] = True
    before = np.cumsum(new) - new  # first consumptions before each event, over the block
    starts = np.concatenate([[0], np.cumsum(drafted)[:-1]])
    kept = new & (before - before[starts][user] < lengths[user])
    return items[kept], np.bincount(user[kept], minlength=drafted.shape[0]).astype(np.int64)


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
