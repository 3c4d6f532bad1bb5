"""The daily job's walk-forward choice of its rankings' popularity prior (``score.popularity_prior.choose``).

Each ``pipeline`` run that appends (``data.append``) and finds a champion first asks how the champion, trained on
the events before this run's append, would have ranked the appended events under every point of
:data:`recsys_alibi.evaluation.popularity_prior.GRID`. The boundary ``b`` is one second after the newest event the
prepared data held before the append; a test user has events before ``b`` and one at or after it on an item it
has not seen and the champion knows, the first of which is its target (the rule of ``benchmarks/replay.py``'s
next period); the counts are the events before ``b``. The champion ranks by raw item id (``score``'s rule). Each day's sums are recorded in ``OUTPUT/popularity_prior.json``, keyed by ``b`` (a re-run of the
same append replaces its entry, so nothing is counted twice); the run's rankings then use the point with the best
mean NDCG@10 over every recorded day, all of which lie before the data the rankings are for: the rule measured in
docs/results.md ("A recent-popularity prior on the next periods"). Weight inf is scored as
:data:`~recsys_alibi.evaluation.popularity_prior.INF_WEIGHT`. No recorded day yet: the configured weight and
half-life.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import polars as pl

from recsys_alibi.config import JobConfig
from recsys_alibi.data import schema

log = logging.getLogger(__name__)

PRIOR_FILE = "popularity_prior.json"
BATCH = 256


def append_boundary(config: JobConfig, prepared_dir: Path) -> int | None:
    """One second after the newest event of ``prepared_dir`` before this run appends to it; None when the choice is
    off, the run does not append, there is no prepared data yet, or its time came from line order."""
    from recsys_alibi.data.time_gaps import has_real_timestamps

    if not (config.score.popularity_prior.choose and config.data.append):
        return None
    sequences = Path(prepared_dir) / schema.SEQUENCES_FILE
    if not sequences.is_file() or not has_real_timestamps(prepared_dir):
        return None
    newest = pl.scan_parquet(sequences).select(pl.col(schema.TIMESTAMP).list.max().max()).collect().item()
    return None if newest is None else int(newest) + 1


def period_examples(sequences: pl.DataFrame, boundary: int, known: np.ndarray | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split time-ordered sequences at ``boundary`` (seconds).

    Args:
        sequences: ``user_id``, ``item_idx`` list, ``timestamp`` list (and ``time_gaps`` list for a time-gap model).
        known: (N + 1,) bool over ``item_idx``: the items a target may be (the model's catalog); None: every item.

    Returns:
        (events before the boundary: ``item_idx``, ``timestamp``; examples: ``user_id``, ``history`` list<Int32>
        (and ``history_time_gaps``), ``targets`` [the first known item at or after the boundary not in the
        history; events of one second in ``item_idx`` order, as ``benchmarks/replay.py`` takes them]).
    """
    from recsys_alibi.data.schema import TIME_GAPS
    from recsys_alibi.data.splits import HISTORY, HISTORY_TIME_GAPS, TARGETS

    lists = [schema.ITEM_IDX, schema.TIMESTAMP, *([TIME_GAPS] if TIME_GAPS in sequences.columns else [])]
    events = sequences.select(schema.USER_ID, *lists).explode(lists).with_row_index("_order")
    before = events.filter(pl.col(schema.TIMESTAMP) < boundary)
    targetable = pl.lit(True) if known is None else pl.col(schema.ITEM_IDX).is_in(np.flatnonzero(known).tolist())
    after = (
        events.filter((pl.col(schema.TIMESTAMP) >= boundary) & targetable)
        .join(before.select(schema.USER_ID, schema.ITEM_IDX), on=[schema.USER_ID, schema.ITEM_IDX], how="anti")
        .sort(schema.TIMESTAMP, schema.ITEM_IDX)
        .group_by(schema.USER_ID, maintain_order=True)
        .first()
    )  # fmt: skip
    gaps = [pl.col(TIME_GAPS).alias(HISTORY_TIME_GAPS)] if TIME_GAPS in lists else []
    histories = before.sort("_order").group_by(schema.USER_ID, maintain_order=True).agg(
        pl.col(schema.ITEM_IDX).cast(pl.Int32).alias(HISTORY), *gaps)  # fmt: skip
    examples = histories.join(after.select(schema.USER_ID, pl.concat_list(pl.col(schema.ITEM_IDX).cast(pl.Int32)).alias(TARGETS)),
                              on=schema.USER_ID, how="inner")  # fmt: skip
    return before.select(schema.ITEM_IDX, schema.TIMESTAMP), examples


def example_grid_metrics(loaded, examples: pl.DataFrame, logprior: np.ndarray) -> np.ndarray:
    """(U, len(GRID), 2) [NDCG@10, HR@10] of a model on ``examples`` under every grid point, in the examples' order.

    Args:
        loaded: a ``LoadedRanker``; ``examples`` in its numbering: ``history`` (whole: read, up to the model's
            ``max_context`` last events, and excluded as ``score`` does), one-item ``targets`` and, for a time-gap
            model, ``history_time_gaps``.
        logprior: (len(HALF_LIVES), N + 1) float64 ``log(1 + c)`` in the model's numbering (:func:`in_model_numbering`).
    """
    import torch

    from recsys_alibi.data.loader import pad_right
    from recsys_alibi.data.splits import HISTORY, HISTORY_TIME_GAPS, TARGETS
    from recsys_alibi.evaluation.popularity_prior import GRID, grid_metrics
    from recsys_alibi.evaluation.ranking import mask_seen
    from recsys_alibi.model.scorer import RankerScorer

    scorer = RankerScorer(loaded.model, name="prior_choice")
    prior = torch.from_numpy(logprior)
    parts = [np.zeros((0, len(GRID), 2))]
    last = slice(-scorer.max_context, None) if scorer.max_context else slice(None)  # learned positions: max_len
    for start in range(0, examples.height, BATCH):
        part = examples.slice(start, BATCH)
        whole = [np.asarray(h) for h in part[HISTORY].to_list()]
        history, lengths = pad_right([h[last] for h in whole])  # (B, L), (B,): what the model reads, as in score
        gaps = None
        if HISTORY_TIME_GAPS in part.columns and scorer.uses_time_gaps:
            gaps, _ = pad_right([np.asarray(g)[last] for g in part[HISTORY_TIME_GAPS].to_list()])
        scores = mask_seen(scorer.score(history, lengths, gaps), pad_right(whole)[0])  # (B, N + 1): whole history seen
        targets = torch.tensor([t[0] for t in part[TARGETS].to_list()], dtype=torch.int64)  # (B,)
        parts.append(grid_metrics(scores, targets, prior))
    return np.concatenate(parts)


def in_model_numbering(logprior: np.ndarray, remap: np.ndarray | None, n_model_items: int) -> np.ndarray:
    """(H, N_data + 1) -> (H, N_model + 1): the data's ``log(1 + c)`` columns moved to the model's item indices by
    ``remap`` (``serving.inputs.vocabulary_remap``; None: the same numbering); items the model does not know drop."""
    if remap is None:
        return logprior
    known = remap > 0
    mapped = np.zeros((logprior.shape[0], n_model_items + 1))
    mapped[:, remap[known]] = logprior[:, known]
    return mapped


def newest_period_sums(loaded, prepared_dir: Path, boundary: int) -> tuple[int, np.ndarray]:
    """(users ranked, (len(GRID),) summed NDCG@10) of a model on the events of ``prepared_dir`` at or after
    ``boundary`` (module doc).

    Args:
        loaded: a ``LoadedRanker`` (the champion), in its own item numbering.
        prepared_dir: the prepared data after this run's append.
        boundary: seconds (:func:`append_boundary`).
    """
    from pipelines.promotion import examples_in_vocabulary
    from recsys_alibi.data.sequences import read_items, read_sequences
    from recsys_alibi.data.time_gaps import sequences_for
    from recsys_alibi.evaluation.popularity_prior import HALF_LIVES, weighted_counts
    from serving.inputs import vocabulary_remap

    items = read_items(prepared_dir)
    remap, _ = vocabulary_remap(items, loaded.items)
    before, examples = period_examples(sequences_for(loaded.model, read_sequences(prepared_dir)), boundary,
                                       None if remap is None else remap > 0)  # fmt: skip
    counts = weighted_counts(before[schema.ITEM_IDX].to_numpy(), before[schema.TIMESTAMP].to_numpy(), boundary,
                             items.height, HALF_LIVES)  # (H, N_data + 1)  # fmt: skip
    logprior = in_model_numbering(np.log1p(counts), remap, loaded.items.height)
    if remap is not None:
        examples = examples_in_vocabulary(examples, remap)[0]
    return examples.height, example_grid_metrics(loaded, examples, logprior)[:, :, 0].sum(0)


def record_newest_period(config: JobConfig, prepared_dir: Path, boundary: int | None, record: Path,
                         champion=None) -> None:  # fmt: skip
    """Rank the appended events with the champion under every grid point and record the day in ``record``
    (atomically, replacing an entry of the same boundary); nothing without a boundary or a champion.

    ``champion``: the run's pinned champion (:class:`pipelines.promotion.Champion`); None: the alias read now. The
    champion is loaded by its version (``models:/NAME/V``), never by the alias read a second time.
    """
    from pipelines.promotion import pin_champion
    from recsys_alibi.atomic import write_json_atomic
    from recsys_alibi.tracking import ModelUriError, load_ranker

    if boundary is None:
        return
    champion = pin_champion(config) if champion is None else champion
    if champion.uri is None:
        return
    try:
        loaded = load_ranker(champion.uri)
    except ModelUriError as err:
        log.warning("popularity prior: the champion cannot be loaded (%s); this day is not recorded", err)
        return
    users, sums = newest_period_sums(loaded, prepared_dir, boundary)
    if not users:  # nothing appended that the champion could rank (a re-run after the append, a day of new items)
        return
    days = read_record(record)
    days[str(boundary)] = {"users": users, "ndcg_sum": sums.tolist()}
    write_json_atomic(record, {"grid": grid_labels(), "days": days})


def read_record(record: Path) -> dict[str, dict]:
    """The recorded days of ``record`` ({boundary: {users, ndcg_sum}}); none when it is absent or was written for
    another grid (another version's points: its sums do not compare; :func:`check_prior_data` sets it aside).

    Raises:
        DataError: one line naming the file and the fix, for a record that is not a regular file, is not JSON, or
            holds an entry that is not ``{"users": U >= 1, "ndcg_sum": [G sums, each a finite number in 0..U]}``
            under a whole boundary (seconds): nothing of it is used or overwritten.
    """
    return _recorded(record)[0]


def _recorded(record: Path) -> tuple[dict[str, dict], bool]:
    """(:func:`read_record`'s days, whether ``record`` is a record of another grid)."""
    import json

    from recsys_alibi.data.ingest import DataError

    if not record.exists() and not record.is_symlink():
        return {}, False
    try:
        if not record.is_file():
            raise ValueError("not a regular file")
        doc = json.loads(record.read_text())
        grid = doc.get("grid") if isinstance(doc, dict) else None
        if not (isinstance(grid, list) and all(isinstance(p, list) and len(p) == 2 for p in grid)):
            raise ValueError("no grid of [weight, half-life] points: not a record of the choice")
        if grid != grid_labels():
            return {}, True  # another version's grid: its sums do not compare
        days = doc.get("days")
        if not isinstance(days, dict):
            raise ValueError("no 'days' object")
        for boundary, day in days.items():
            if not boundary.isdigit():
                raise ValueError(f"day {boundary!r}: not a boundary in whole seconds")
            if not isinstance(day, dict) or "users" not in day or "ndcg_sum" not in day:
                raise ValueError(f"day {boundary}: not an object with users and ndcg_sum")
            users, sums = day["users"], day["ndcg_sum"]
            if isinstance(users, bool) or not isinstance(users, int) or users < 1:
                raise ValueError(f"day {boundary}: users {users!r} is not a whole number >= 1")
            if not isinstance(sums, list) or len(sums) != len(grid_labels()) or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and 0 <= x <= users
                    for x in sums):  # fmt: skip
                raise ValueError(f"day {boundary}: ndcg_sum is not {len(grid_labels())} finite sums in 0..{users}")
        return days, False
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        raise DataError(f"{record} is damaged ({err}); delete it to start the choice over, or set "
                        "score.popularity_prior.choose=false") from None  # fmt: skip


def check_prior_data(config: JobConfig, prepared_dir: Path, record: Path) -> None:
    """Refuse, before any work, what would stop the scoring step after training: a prior weight on data whose time
    came from line order, and a damaged choice record (:func:`read_record`). A record of another grid (another
    version's) is set aside as ``popularity_prior.json.other-grid-<seconds>`` with a warning, never overwritten.

    Raises:
        DataError: one line naming the fix.
    """
    from recsys_alibi.data.ingest import DataError
    from recsys_alibi.data.time_gaps import has_real_timestamps

    prior = config.score.popularity_prior
    if prior.weight and (Path(prepared_dir) / schema.SEQUENCES_FILE).is_file() and not has_real_timestamps(prepared_dir):
        raise DataError(f"score.popularity_prior.weight={prior.weight:g} needs event times and {prepared_dir} took its "
                        "time from line order; set score.popularity_prior.weight=0")  # fmt: skip
    if prior.choose and config.data.append and _recorded(record)[1]:
        stamp = int(time.time())
        while (aside := record.with_name(f"{record.name}.other-grid-{stamp}")).exists() or aside.is_symlink():
            stamp += 1  # never onto an earlier one
        record.rename(aside)  # kept, never overwritten: the choice starts over on this version's grid
        log.warning("popularity prior: %s was written for another grid of the choice than this version's %d points; "
                    "set aside as %s, the choice starts over", record, len(grid_labels()), aside.name)  # fmt: skip


def grid_labels() -> list[list]:
    """:data:`GRID` as JSON: [[weight or "inf", half-life days or None], ...]."""
    from recsys_alibi.evaluation.popularity_prior import GRID

    return [["inf" if math.isinf(b) else b, h] for b, h in GRID]


def chosen_prior(config: JobConfig, prepared_dir: Path, record: Path) -> tuple[dict, str]:
    """The ``score.popularity_prior`` settings the run's rankings use and a line saying why.

    The best grid point over every recorded day (ties: the first, so the smaller weight); the configured
    settings (and no line) when the choice is off or the run does not append, and (with a line) when the time of
    ``prepared_dir`` came from line order (the configured weight: 0, which :func:`check_prior_data` made sure of)
    or no day is recorded yet.
    """
    from recsys_alibi.evaluation.popularity_prior import GRID, INF_WEIGHT

    from recsys_alibi.data.time_gaps import has_real_timestamps

    prior = config.score.popularity_prior
    configured = {"weight": prior.weight, "half_life_days": prior.half_life_days}
    if not (prior.choose and config.data.append):
        return configured, ""
    if not has_real_timestamps(prepared_dir):  # line-order time: no recency to weigh, nothing to choose
        return configured, (f"popularity prior: off (the time of {prepared_dir} came from line order: there is no "
                            "recent popularity to choose)")  # fmt: skip
    days = read_record(record)
    users = sum(int(d["users"]) for d in days.values())
    if not users:
        return configured, (f"popularity prior: no day recorded yet, weight {prior.weight:g} as configured "
                            f"(the choice starts with the first appended day a champion can rank)")  # fmt: skip
    means = np.sum([d["ndcg_sum"] for d in days.values()], axis=0) / users
    best = max(range(len(GRID)), key=lambda g: (means[g], -g))
    beta, half_life = GRID[best]
    weight = INF_WEIGHT if math.isinf(beta) else beta
    days_text = "null (plain counts)" if half_life is None else f"{half_life:g} day{'' if half_life == 1 else 's'}"
    setting = "weight 0 (no prior)" if beta == 0 else (f"weight {'inf' if math.isinf(beta) else f'{beta:g}'}, "
                                                       f"half-life {days_text}")  # fmt: skip
    # both values as `--set score.popularity_prior.weight=W` and `.half_life_days=H` take them (`inf`, `null`)
    line = (f"popularity prior: {setting}, chosen on {len(days)} appended day(s), "
            f"{users} users (NDCG@10 {means[best]:.4f} against {means[GRID.index((0.0, half_life))]:.4f} without)")  # fmt: skip
    return {"weight": weight, "half_life_days": half_life}, line
