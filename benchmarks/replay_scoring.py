"""How one model of a replay step ranks the next period: per user, per target kind, and its top 10.

Used by ``benchmarks/replay.py``. Every model is scored on the same test examples (each test
user's first next-period event with an item of step ``k``'s catalog that is not in the history),
in its own item numbering matched by raw ``item_id`` (``serving.inputs.vocabulary_remap``, as
``score`` and the promotion gate do): a model that does not know a target (``stale``, a model of
an earlier step, lacks the items added since) counts it as a miss, and history events of items it
does not know are dropped (``pipelines.promotion.examples_in_vocabulary``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import torch

KINDS = ("new_this_period", "new_earlier", "older")  # target item entered the catalog at step k / 1..k-1 / 0
BATCH = 64


def entry_steps(events: pl.DataFrame, bounds: list[int]) -> dict:
    """item_id -> the step whose catalog first holds it: 0 for an event before ``bounds[0]``, ``j`` for a
    first event in ``[bounds[j-1], bounds[j])`` (exact for a prepare with ``min_events_per_item: 1``)."""
    first = events.group_by("item_id").agg(pl.col("timestamp").min())
    steps = np.searchsorted(np.asarray(bounds), first["timestamp"].to_numpy(), side="right")
    return dict(zip(first["item_id"].to_list(), steps.tolist()))


def target_kind(entry: int, step: int) -> str:
    """The kind of a step-``step`` target whose item entered the catalog at step ``entry`` (:data:`KINDS`)."""
    return KINDS[0] if entry == step else KINDS[1] if entry > 0 else KINDS[2]


def scored_batches(loaded, examples: pl.DataFrame, extra=None, window: int | None = None):
    """Yield ``(part, scores)`` per batch of ``examples``: ``scores`` (B, N + 1) float, or (B, N + M + 1) with
    ``extra`` beside the catalog, every history item and the padding column at -inf.

    Args:
        loaded: a ``LoadedRanker`` (model and its vocabulary).
        examples: ``history``, ``targets`` (one item) and, for a time-gap model, ``history_time_gaps``,
            all in the model's numbering.
        extra: optional ``serving.new_items.NewItems``: items the model never saw, ranked from their feature
            vectors (M, D) beside its catalog at indices N + 1 .. N + M (what ``score --items`` does); a target
            may be one of them.
        window: the model reads only the last ``window`` items of each history (what training's validation
            does: ``model.max_len``); None: the whole history. The whole history is excluded either way.
    """
    from recsys_alibi.data.loader import pad_right
    from recsys_alibi.data.splits import HISTORY, HISTORY_TIME_GAPS
    from recsys_alibi.evaluation.ranking import mask_seen
    from recsys_alibi.model.scorer import RankerScorer

    scorer = RankerScorer(loaded.model, name="replay")
    for start in range(0, examples.height, BATCH):
        part = examples.slice(start, BATCH)
        whole = [np.asarray(h) for h in part[HISTORY].to_list()]
        history, lengths = pad_right([h[-window:] for h in whole] if window else whole)  # (B, L), (B,)
        seen = pad_right(whole)[0] if window else history  # (B, S): every history item is excluded
        gaps = None
        if HISTORY_TIME_GAPS in part.columns and scorer.uses_time_gaps:
            gaps, _ = pad_right([np.asarray(g)[-window:] if window else np.asarray(g) for g in part[HISTORY_TIME_GAPS].to_list()])
        if extra is None:
            scores = scorer.score(history, lengths, gaps)  # (B, N + 1)
        else:
            with torch.inference_mode():
                hidden = loaded.model.eval().last_hidden(history, lengths, gaps=gaps).float()  # (B, D)
                scores = torch.cat([loaded.model.logits(hidden), hidden @ extra.vectors.float().T], dim=1)  # (B, N + M + 1)
        yield part, mask_seen(scores, seen)


def rank_examples(
    loaded, examples: pl.DataFrame, extra=None, window: int | None = None, slots: int = 0
) -> tuple[np.ndarray, list[list]]:
    """Ranks of each example's target and its top 10 raw item ids, every history item excluded
    (arguments: :func:`scored_batches`).

    Args:
        slots: places of the top 10 held for the best new items of ``extra`` (``score.new_item_slots``:
            ``serving.topk.reserve_new_items``); a target pushed out of the top 10 gets rank 11 at least, so
            the figures at 10 are exact and those at other cut-offs are not.

    Returns:
        ranks (U,) int64 (``MISS_RANK`` for a masked target) and the top-10 raw ``item_id`` lists.
    """
    from recsys_alibi.data.splits import TARGETS
    from recsys_alibi.evaluation.ranking import target_ranks
    from serving.topk import slotted_ranks

    raw = loaded.items.sort("item_idx")["item_id"].to_list()  # model item_idx i -> raw[i - 1]
    if extra is not None:
        raw += extra.ids.to_list()
    ranks, tops = [], []
    for part, scores in scored_batches(loaded, examples, extra, window):
        targets = torch.tensor([t[0] for t in part[TARGETS].to_list()], dtype=torch.int64)  # (B,)
        rank = target_ranks(scores, targets)  # (B,)
        first = loaded.items.height + 1  # the new items' first column
        rank, columns = slotted_ranks(scores, targets, rank, 10, slots if extra is not None else 0, first)  # (B,), (B, 10)
        ranks.append(rank.numpy())
        tops += [[raw[c - 1] for c in row if c > 0] for row in columns.tolist()]
    return (np.concatenate(ranks) if ranks else np.zeros(0, dtype=np.int64)), tops


def new_item_ranks(loaded, examples: pl.DataFrame, extra) -> tuple[np.ndarray, np.ndarray]:
    """Where each cold target stands among the new items alone, and how far the best new item is from the top.

    Args:
        loaded: a ``LoadedRanker`` with item features.
        examples: ``history`` (model numbering, whole history read) and ``targets`` [N + 1 + j] for new item ``j``
            (:func:`replay_cold.with_targets`; [0], an item without a table row, gets rank 0 in both outputs).
        extra: ``serving.new_items.NewItems``, vectors (M, D).

    Returns:
        (U,) int64 the target's rank among the M new items (1 = the best-scored new item) and (U,) int64 the rank
        the best-scored new item takes among the catalog items the user has not seen (1 = above them all).
    """
    from recsys_alibi.data.splits import TARGETS

    n = loaded.items.height
    within, best = [], []
    for part, scores in scored_batches(loaded, examples, extra):
        catalog, new = scores[:, : n + 1], scores[:, n + 1 :]  # (B, N + 1) seen at -inf, (B, M) never seen
        column = torch.tensor([t[0] for t in part[TARGETS].to_list()], dtype=torch.int64) - n - 1  # (B,)
        valid = column >= 0
        target = new.gather(1, column.clamp(min=0)[:, None])  # (B, 1)
        within.append(torch.where(valid, (new > target).sum(1) + 1, 0).numpy())
        best.append(torch.where(valid, (catalog > new.max(1, keepdim=True).values).sum(1) + 1, 0).numpy())
    empty = np.zeros(0, dtype=np.int64)
    return (np.concatenate(within) if within else empty), (np.concatenate(best) if best else empty)


def score_model(loaded, prepared: Path, examples: pl.DataFrame, entry: dict, step: int) -> dict:
    """Next-period metrics of one model on ``examples`` (``replay.next_period_examples``, step numbering).

    Returns:
        ``NDCG@10``, ``HR@10`` (means over every test user, unservable ones as misses),
        ``per_user`` {str(user_id): [NDCG@10, HR@10]}, ``target_kinds`` {str(user_id): kind}, ``by_target_kind`` {kind: {n, NDCG@10, HR@10}},
        ``top10_share_new`` (share of the top-10 slots held by items that entered at this step) and
        ``unservable`` (test users whose target or whole history the model does not know).
    """
    from pipelines.promotion import examples_in_vocabulary
    from recsys_alibi.data.sequences import read_items
    from recsys_alibi.data.splits import TARGETS
    from recsys_alibi.evaluation.metrics import per_user_metrics
    from serving.inputs import vocabulary_remap

    items = read_items(prepared).select("item_idx", "item_id")
    target_ids = dict(zip(examples["user_id"].to_list(), items.sort("item_idx")["item_id"].gather(
        examples[TARGETS].list.first().cast(pl.Int64) - 1).to_list()))  # fmt: skip
    remap, _ = vocabulary_remap(items, loaded.items)
    served = examples if remap is None else examples_in_vocabulary(examples, remap)[0]
    ranks, tops = rank_examples(loaded, served)
    metrics = per_user_metrics(ranks, [10])
    # keyed by str(user_id): the same keys before and after a JSON round trip
    per_user = {str(u): [0.0, 0.0] for u in examples["user_id"].to_list()}  # unservable: misses
    for u, n, h in zip(served["user_id"].to_list(), metrics["NDCG@10"].tolist(), metrics["HR@10"].tolist()):
        per_user[str(u)] = [n, h]
    kinds = {str(u): target_kind(entry[t], step) for u, t in target_ids.items()}
    by_kind = {}
    for kind in KINDS:
        rows = [v for u, v in per_user.items() if kinds[u] == kind]
        by_kind[kind] = {"n": len(rows), "NDCG@10": float(np.mean([r[0] for r in rows])) if rows else None,
                         "HR@10": float(np.mean([r[1] for r in rows])) if rows else None}  # fmt: skip
    slots = [i for top in tops for i in top]
    values = np.array(list(per_user.values())) if per_user else np.zeros((0, 2))
    return {
        "NDCG@10": float(values[:, 0].mean()) if len(values) else None,
        "HR@10": float(values[:, 1].mean()) if len(values) else None,
        "per_user": per_user,
        "target_kinds": kinds,
        "by_target_kind": by_kind,
        "top10_share_new": sum(entry.get(i) == step for i in slots) / len(slots) if slots else None,
        "unservable": examples.height - served.height,
    }


def returning_users(events: pl.DataFrame, lo: int, hi: int) -> set:
    """Raw ids of the users with at least one event in ``[lo, hi)`` (seconds)."""
    return set(events.filter((pl.col("timestamp") >= lo) & (pl.col("timestamp") < hi))["user_id"].unique().to_list())


def validation_per_user(loaded, prepared: Path) -> dict[str, list[float]]:
    """{str(user_id): [NDCG@10, HR@10]} of one model on the leave-one-out validation examples of ``prepared``,
    scored as training validates (the last ``model.max_len`` items read, the whole history excluded): over all
    users it is the run's own ``val_NDCG@10``.

    Raises:
        SystemExit: the model's vocabulary is not the step's catalog (not a model of this replay step).
    """
    from pipelines.promotion import validation_examples
    from recsys_alibi.data.prepare import read_sequences
    from recsys_alibi.data.sequences import read_items
    from recsys_alibi.data.time_gaps import sequences_for
    from recsys_alibi.evaluation.metrics import per_user_metrics
    from serving.inputs import vocabulary_remap

    remap, _ = vocabulary_remap(read_items(prepared), loaded.items)
    if remap is not None:
        raise SystemExit("a model's vocabulary is not its step's catalog: not a model of this replay")
    examples = validation_examples(sequences_for(loaded.model, read_sequences(prepared)))
    ranks, _ = rank_examples(loaded, examples, window=loaded.model.cfg.max_len)  # as training validates
    m = per_user_metrics(ranks, [10])
    return {str(u): [float(n), float(h)] for u, n, h in zip(examples["user_id"].to_list(), m["NDCG@10"], m["HR@10"])}


def row_movement(parent_state: dict, init_state: dict, child_state: dict, new_rows: np.ndarray) -> dict:
    """How far a warm run moved the item rows: mean L2 distance from where they started.

    Args:
        parent_state / init_state / child_state: item tables of the parent model, the warm start's
            initial weights and the trained child (state dicts holding ``ITEM_TABLE_KEY``).
        new_rows: (M,) int64 child item indices of items the parent does not know.

    Returns:
        ``old_rows`` (mean over shared items of ||child - init||, init = the parent's row),
        ``new_rows`` (the same for new items, from their initial rows), ``old_row_norm`` (mean ||parent row||).
    """
    from recsys_alibi.training.warm_start import ITEM_TABLE_KEY

    init, child = init_state[ITEM_TABLE_KEY].float(), child_state[ITEM_TABLE_KEY].float()  # (N + 1, D)
    moved = (child - init).norm(dim=1)  # (N + 1,)
    new = torch.zeros(moved.shape[0], dtype=torch.bool)
    new[torch.as_tensor(new_rows, dtype=torch.int64)] = True
    old = ~new
    old[0] = False  # padding
    parent = parent_state[ITEM_TABLE_KEY].float()[1:]
    return {
        "old_rows": float(moved[old].mean()) if bool(old.any()) else None,
        "new_rows": float(moved[new].mean()) if bool(new.any()) else None,
        "old_row_norm": float(parent.norm(dim=1).mean()),
    }
