"""Offline full-catalog ranking evaluation of any ``Scorer`` (model or baseline).

``evaluate`` takes one row per user (``user_id``, ``history`` list<int32> of item indices 1..N
in time order, ``targets`` list<int32> of held-out items: one for leave-one-out, several for
the temporal split), scores the whole catalog in batches of ``cfg.batch_size`` users, masks
the seen items of the whole history when ``cfg.exclude_seen`` (``ranking.mask_seen``; a seen
target is masked too and counts as a miss: the one seen-item rule of ``ranking``, the same as
training validation, the promotion gate and ``score``), ranks the targets
(``ranking.target_ranks``) and averages the metrics of ``metrics.py``:

- ``metrics``: with the default context: the whole history, clipped to the last
  ``scorer.max_context`` events when the scorer has a limit;
- ``by_history_length``: the same per-user values sliced by the length of the *whole*
  history into buckets with upper edges ``cfg.history_buckets`` ("1-20", "21-50", ...,
  ">1000"; a user with an empty history falls in the first bucket; empty buckets are left out);
- ``by_min_history``: the users with at least L events, for each L of ``cfg.min_history``
  (``">=200"``, ``">=500"``: the heavy users), left out when no user has that many;
- ``by_context_length``: the model sees only the last L events, for each requested L
  (``"full"``/None = the whole history). Seen-item masking always uses the whole history, so
  only the model input changes along the sweep. Where ``L > scorer.max_context`` the scorer
  cannot take that context: every metric is ``None`` (left out of report.json) and a note says so;
- ``paired_vs_context``: for each L of the sweep, the per-user paired difference of HR@K and
  NDCG@K (K = 10 when evaluated) between the default context and the last L events, with its
  bootstrap 95 % interval (``recsys_alibi.evaluation.paired``), overall and per ``">=L"`` slice.

Users are processed in order of history length so that a batch holds similar lengths; passes
whose truncation is identical for every user are computed once and reused.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import polars as pl
import torch

from recsys_alibi.config import EvaluateConfig
from recsys_alibi.data.buckets import plan_batches
from recsys_alibi.data.loader import FlatSequences, check_aligned
from recsys_alibi.data.splits import HISTORY_TIME_GAPS
from recsys_alibi.evaluation.metrics import coverage_at_k, metric_names, per_user_metrics
from recsys_alibi.evaluation.paired import paired_difference
from recsys_alibi.evaluation.ranking import mask_seen, target_ranks, topk

__all__ = [
    "EvaluationResult",
    "Scorer",
    "bucket_labels",
    "context_key",
    "evaluate",
    "min_history_key",
    "paired_metrics",
]

logger = logging.getLogger(__name__)

USER_ID = "user_id"
HISTORY = "history"
TARGETS = "targets"
FULL = "full"


@runtime_checkable
class Scorer(Protocol):
    """What the evaluator (and batch scoring) calls; models and baselines implement it.

    Attributes:
        name: short label used in reports ("alibi", "sasrec", "popularity").
        max_context: longest history accepted, in events (None = any length). A learned-position
            SASRec sets its ``max_len``; the evaluator never passes more than this.

    Optional: a scorer with ``uses_time_gaps = True`` (a ranker trained with
    ``model.time_gap_buckets``) is called as ``score(history, lengths, gaps)``, gaps (B, L) int64
    time-gap buckets aligned with history; the examples must then carry ``history_time_gaps``.
    """

    name: str
    max_context: int | None

    def score(self, history: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Score the whole catalog for each user.

        Args:
            history: (B, L) int64 item indices 1..N, right-padded with 0, oldest first (CPU;
                the scorer moves it to its device). L = the longest history in the batch.
            lengths: (B,) int64 number of valid events per row (may be 0).

        Returns:
            (B, N+1) float scores (float32 preferred), higher = better; column 0 is ignored.
            Called under ``torch.no_grad()``; putting a model in eval mode is the scorer's job.
        """
        ...


@dataclass(frozen=True)
class EvaluationResult:
    """The outcome of one ``evaluate`` call; ``to_json`` gives the report.json contract shape.

    Attributes:
        protocol: evaluation protocol name ("leave_one_out", "temporal", ...).
        n_users: users evaluated (users without a target are skipped and noted).
        metrics: metric name ("HR@10", "NDCG@10", "Recall@10", "MRR", "Coverage@10") -> value.
        by_context_length: "<L>" or "full" -> metrics with the last L events as context;
            every value None where the scorer's ``max_context`` is below L (left out of report.json).
        by_history_length: bucket label ("1-20", ..., ">1000") -> metrics of its users.
        by_min_history: ``">=L"`` -> metrics of the users with at least L events.
        paired_vs_context: context key ``"<L>"`` -> slice (``"all"``, ``">=L"``) -> metric ->
            :meth:`PairedDifference.to_json` of default context (candidate) minus last L events
            (baseline).
        per_user: metric name -> (U,) float64 per-user values with the default context, in the
            order of ``user_ids`` (not in report.json; for paired comparisons of two scorers).
        user_ids: (U,) the examples' ``user_id`` values, same order.
        history_lengths: (U,) int64 whole-history lengths, same order.
        scorer: ``Scorer.name``.
        ks: the cut-offs, in order.
        history_bucket_sizes: bucket label -> number of users (empty buckets included).
        tied_share: share of users whose ranks differ between the optimistic and pessimistic
            tie rules (a target tied with another item); large values mean the optimistic
            default flatters the scorer.
        ties: the tie rule used ("optimistic" or "pessimistic").
        notes: human-readable remarks (skipped users, where the sweep stops, clipping).
        seconds: wall time of the evaluation.
        split: what the examples are: ``targets`` (target events, all users) and, under the temporal protocol,
            ``temporal_cutoff`` (seconds since epoch: targets at or after it); empty when not given.
    """

    protocol: str
    n_users: int
    metrics: dict[str, float]
    by_context_length: dict[str, dict[str, float | None]]
    by_history_length: dict[str, dict[str, float]]
    scorer: str = ""
    ks: tuple[int, ...] = ()
    history_bucket_sizes: dict[str, int] = field(default_factory=dict)
    tied_share: float = 0.0
    ties: str = "optimistic"
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    by_min_history: dict[str, dict[str, float]] = field(default_factory=dict)
    paired_vs_context: dict[str, dict[str, dict[str, dict[str, Any]]]] = field(default_factory=dict)
    per_user: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    user_ids: np.ndarray | None = field(default=None, repr=False, compare=False)
    history_lengths: np.ndarray | None = field(default=None, repr=False, compare=False)
    split: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The report.json document: the CONTRACT keys (plain Python types), then
        ``by_min_history``, ``paired_vs_context`` and ``split`` (when known)."""
        return {
            "protocol": self.protocol,
            "n_users": int(self.n_users),
            "metrics": {k: float(v) for k, v in self.metrics.items()},
            "by_context_length": {  # {metric: float} per the contract: a context the scorer cannot take (all
                key: {k: float(v) for k, v in m.items()}  # None, beyond its max_context) is left out; a note says so
                for key, m in self.by_context_length.items() if any(v is not None for v in m.values())
            },
            "by_history_length": {
                key: {k: float(v) for k, v in m.items()} for key, m in self.by_history_length.items()
            },
            "by_min_history": {key: {k: float(v) for k, v in m.items()} for key, m in self.by_min_history.items()},
            "paired_vs_context": self.paired_vs_context,
            **({"split": {k: int(v) for k, v in self.split.items()}} if self.split else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], *, scorer: str = "") -> "EvaluationResult":
        """Rebuild a result from a report.json document (extra fields get their defaults)."""
        metrics = {k: float(v) for k, v in data["metrics"].items()}
        ks = tuple(int(name.split("@")[1]) for name in metrics if name.startswith("HR@"))
        return cls(
            protocol=str(data["protocol"]),
            n_users=int(data["n_users"]),
            metrics=metrics,
            by_context_length={k: dict(v) for k, v in data.get("by_context_length", {}).items()},
            by_history_length={k: dict(v) for k, v in data.get("by_history_length", {}).items()},
            by_min_history={k: dict(v) for k, v in data.get("by_min_history", {}).items()},
            paired_vs_context=data.get("paired_vs_context", {}),
            split={k: int(v) for k, v in data.get("split", {}).items()},
            scorer=scorer,
            ks=ks,
        )


def context_key(context: int | str | None) -> str:
    """Sweep key: ``"full"`` for None/"full", else ``str(L)`` for an integer L >= 1."""
    if context is None or context == FULL:
        return FULL
    if isinstance(context, bool) or not isinstance(context, (int, np.integer)) or context < 1:
        raise ValueError(f"context lengths must be integers >= 1, None or 'full', got {context!r}")
    return str(int(context))


def min_history_key(length: int) -> str:
    """Slice key of the users with at least ``length`` events: ``">=500"``."""
    return f">={int(length)}"


def paired_metrics(ks: Sequence[int]) -> list[str]:
    """The metrics compared user by user: HR@K and NDCG@K at K = 10 when evaluated, else the middle K."""
    ks = list(ks)
    k = 10 if 10 in ks else sorted(ks)[len(ks) // 2]
    return [f"HR@{k}", f"NDCG@{k}"]


def _paired(
    candidate: _Pass, baseline: _Pass, slices: dict[str, np.ndarray], names: Sequence[str], seed: int
) -> dict[str, dict[str, dict[str, Any]]]:
    """slice -> metric -> paired difference (candidate - baseline) of the users in the slice."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for label, rows in slices.items():
        out[label] = {
            name: paired_difference(candidate.per_user[name][rows], baseline.per_user[name][rows], seed=seed).to_json()
            for name in names
        }
    return out


def _bucket_edges(edges: Sequence[int]) -> list[int]:
    edges = sorted({int(e) for e in edges})
    if edges and edges[0] < 1:
        raise ValueError(f"evaluate.history_buckets must be positive upper edges, got {edges}")
    return edges


def bucket_names(edges: Sequence[int]) -> list[str]:
    """Bucket labels for upper edges, e.g. [20, 50] -> ["1-20", "21-50", ">50"]."""
    edges = _bucket_edges(edges)
    if not edges:
        return ["all"]
    names, lower = [], 1
    for e in edges:
        names.append(f"{lower}-{e}")
        lower = e + 1
    return names + [f">{edges[-1]}"]


def bucket_labels(lengths: Any, edges: Sequence[int]) -> np.ndarray:
    """Per-user bucket label (object array of str) for history lengths (U,) int.

    A length l falls in the first bucket whose upper edge is >= l; beyond the last edge ">E".
    """
    names = np.asarray(bucket_names(edges), dtype=object)
    idx = np.searchsorted(np.asarray(_bucket_edges(edges), dtype=np.int64), np.asarray(lengths), side="left")
    return names[idx]


def _checked_lists(s: pl.Series, n_items: int) -> FlatSequences:
    """A list<int> column of item indices 1..N, flattened; ValueError on nulls or out-of-range items."""
    if not isinstance(s.dtype, pl.List) or not s.dtype.inner.is_integer():
        raise ValueError(f"column '{s.name}' must be list<int>, got {s.dtype}")
    if s.null_count() or s.list.eval(pl.element().is_null().any()).explode().any():
        raise ValueError(f"column '{s.name}' has null lists or null items; drop or repair those rows first")
    lists = FlatSequences.from_series(s)
    values = lists.values
    if values.size and (values.min() < 1 or values.max() > n_items):
        raise ValueError(
            f"column '{s.name}' holds item indices {values.min()}..{values.max()}, outside 1..{n_items} "
            "(is n_items the size of the same vocabulary?)"
        )
    return lists


@dataclass
class _Pass:
    """Per-user results of one pass over all users (row order = the examples' order)."""

    per_user: dict[str, np.ndarray]  # name -> (U,) float64
    top: np.ndarray  # (U, K) int32 top-K items, 0 where the slot held a masked item
    tied: np.ndarray  # (U,) bool: the tie rule changes this user's ranks


@contextlib.contextmanager
def _progress_bar(enabled: bool, description: str, total: int) -> Iterator[Callable[[], None]]:
    if not enabled:
        yield lambda: None
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda: bar.advance(task)


def _tie_sensitive(scores: torch.Tensor, targets: torch.Tensor, ranks: torch.Tensor, ties: str) -> torch.Tensor:
    """(B,) bool: the other tie rule would give this user different ranks (a target tied with an item)."""
    other = target_ranks(scores, targets, ties="pessimistic" if ties == "optimistic" else "optimistic")
    other = other.reshape(ranks.shape)
    return (ranks.sort(dim=1).values != other.sort(dim=1).values).any(dim=1)


def _score_pass(
    scorer: Scorer,
    history: FlatSequences,
    gaps: FlatSequences | None,
    targets: FlatSequences,
    order: np.ndarray,
    n_items: int,
    cfg: EvaluateConfig,
    ks: Sequence[int],
    context: int | None,
    progress: bool,
    label: str,
) -> _Pass:
    n_users = len(order)
    k_top = min(max(ks), n_items + 1)
    per_user = {name: np.empty(n_users) for name in metric_names(ks) if not name.startswith("Coverage@")}
    top = np.zeros((n_users, k_top), dtype=np.int32)
    tied = np.zeros(n_users, dtype=bool)
    widths = history.lengths()[order] if context is None else np.minimum(history.lengths()[order], context)
    batches = [order[a:b] for a, b in plan_batches(widths, cfg.batch_size, cfg.batch_tokens)]  # longest first
    with _progress_bar(progress, f"{scorer.name} {label}", len(batches)) as advance, torch.no_grad():
        for rows in batches:
            hist, lengths = history.padded(rows, context)  # (B, L), (B,)
            seen = hist if int(lengths.sum()) == int(history.lengths()[rows].sum()) else history.padded(rows)[0]
            tgt, n_tgt = targets.padded(rows)  # (B, T)
            if gaps is None:
                scores = scorer.score(hist, lengths)
            else:
                scores = scorer.score(hist, lengths, gaps.padded(rows, context)[0])  # gaps (B, L)
            if scores.shape != (len(rows), n_items + 1):
                raise ValueError(
                    f"scorer '{scorer.name}' returned scores of shape {tuple(scores.shape)}, "
                    f"expected ({len(rows)}, {n_items + 1}) = (B, N+1)"
                )
            scores = scores.detach().to(torch.float32, copy=True)  # masked in place: never touch the scorer's tensor
            if torch.isnan(scores[:, 1:]).any():
                raise ValueError(f"scorer '{scorer.name}' returned NaN scores; fix the model before evaluating")
            scores = mask_seen(scores, seen, exclude_seen=cfg.exclude_seen)  # seen targets too: misses
            tgt_in = tgt[:, 0] if int(n_tgt.max()) == 1 else tgt  # (B,) fast path for one target each
            ranks = target_ranks(scores, tgt_in, ties=cfg.ties).reshape(len(rows), -1)  # (B, T)
            tied[rows] = _tie_sensitive(scores, tgt_in, ranks, cfg.ties).cpu().numpy()
            for name, values in per_user_metrics(ranks.cpu().numpy(), ks).items():
                per_user[name][rows] = values
            vals, items = topk(scores, k_top)
            top[rows] = torch.where(torch.isneginf(vals), 0, items).cpu().numpy()
            advance()
    return _Pass(per_user, top, tied)


def _aggregate(p: _Pass, rows: np.ndarray | slice, ks: Sequence[int], n_items: int) -> dict[str, float]:
    out = {}
    for name in metric_names(ks):
        if name.startswith("Coverage@"):
            out[name] = coverage_at_k(p.top[rows], n_items, int(name.split("@")[1]))
        else:
            out[name] = float(np.mean(p.per_user[name][rows]))
    return out


def evaluate(
    scorer: Scorer,
    examples: pl.DataFrame,
    n_items: int,
    cfg: EvaluateConfig,
    *,
    protocol_name: str,
    context_lengths: Sequence[int | str | None] = (),
    progress: bool = False,
) -> EvaluationResult:
    """Full-catalog ranking evaluation of ``scorer`` on ``examples``.

    Args:
        scorer: implements ``Scorer``.
        examples: one row per user: ``user_id``, ``history`` list<int> (items 1..N, time order),
            ``targets`` list<int> (held-out items, >= 1 per user; users with none are skipped).
        n_items: N, the catalog size (scores are (B, N+1)).
        cfg: ``ks``, ``batch_size``, ``exclude_seen``, ``history_buckets``, ``ties``;
            ``cfg.context_lengths`` is the sweep when ``context_lengths`` is empty.
        protocol_name: recorded as ``protocol`` in the result.
        context_lengths: the context-length sweep: ints >= 1 and/or None/"full".
        progress: show a rich progress bar.

    Returns:
        EvaluationResult (see its docstring); metric definitions in ``metrics.py``.

    Raises:
        ValueError: missing columns, null or out-of-range item indices, no user with a target,
            bad ks / context lengths, scores of the wrong shape or with NaN.
    """
    start = time.perf_counter()
    if n_items < 1:
        raise ValueError(f"n_items must be >= 1, got {n_items}")
    ks = list(dict.fromkeys(int(k) for k in cfg.ks))
    if not ks or min(ks) < 1:
        raise ValueError(f"evaluate.ks must be a non-empty list of positive integers, got {cfg.ks}")
    missing = {USER_ID, HISTORY, TARGETS} - set(examples.columns)
    if missing:
        raise ValueError(f"evaluation examples lack column(s) {sorted(missing)}; expected user_id, history, targets")
    sweep = list(context_lengths) if len(context_lengths) else list(cfg.context_lengths)
    keys = [context_key(c) for c in sweep]

    notes: list[str] = []
    has_target = examples[TARGETS].list.len().fill_null(0) > 0
    if not bool(has_target.all()):
        skipped = int((~has_target).sum())
        notes.append(f"{skipped} user(s) without a target were skipped")
        examples = examples.filter(has_target)
    if examples.height == 0:
        raise ValueError("no users to evaluate: the examples hold no user with a target")
    history = _checked_lists(examples[HISTORY], n_items)
    targets = _checked_lists(examples[TARGETS], n_items)
    gaps = None
    if getattr(scorer, "uses_time_gaps", False):
        if HISTORY_TIME_GAPS not in examples.columns:
            raise ValueError(
                f"scorer '{scorer.name}' reads time gaps: the examples need a '{HISTORY_TIME_GAPS}' column "
                "(split sequences that carry time_gaps, recsys_alibi.data.time_gaps.with_time_gaps)"
            )
        gaps = FlatSequences.from_series(examples[HISTORY_TIME_GAPS])
        check_aligned(history, gaps)
    hist_len = history.lengths()
    longest = int(hist_len.max())
    order = np.argsort(-hist_len, kind="stable")  # similar lengths share a batch

    limit = scorer.max_context
    passes: dict[int, _Pass] = {}

    def run(context: int | None, label: str) -> _Pass:
        effective = longest if context is None else min(context, longest)  # same input => same pass
        if effective not in passes:
            t0 = time.perf_counter()
            passes[effective] = _score_pass(
                scorer, history, gaps, targets, order, n_items, cfg, ks, effective, progress, label
            )
            logger.info("%s: %s pass over %d users in %.1fs", scorer.name, label, len(order), time.perf_counter() - t0)
        return passes[effective]

    clipped = limit is not None and longest > limit
    if clipped:
        n_clipped = int((hist_len > limit).sum())
        notes.append(
            f"{n_clipped} user(s) have more than max_context={limit} events: the default and 'full' "
            f"contexts use their last {limit} events"
        )
    main = run(limit, "full context")
    metrics = _aggregate(main, slice(None), ks, n_items)

    by_context: dict[str, dict[str, float | None]] = {}
    for c, key in zip(sweep, keys):
        if key in by_context:
            continue
        if key != FULL and limit is not None and int(c) > limit:
            by_context[key] = {name: None for name in metric_names(ks)}
            notes.append(f"context {key}: {scorer.name} accepts at most max_context={limit} events; the sweep stops there")
            continue
        p = run(limit if key == FULL else int(c), f"context {key}")
        by_context[key] = _aggregate(p, slice(None), ks, n_items)

    labels = bucket_labels(hist_len, cfg.history_buckets)
    sizes = {name: int((labels == name).sum()) for name in bucket_names(cfg.history_buckets)}
    by_history = {
        name: _aggregate(main, np.flatnonzero(labels == name), ks, n_items) for name, size in sizes.items() if size
    }
    heavy = {min_history_key(m): np.flatnonzero(hist_len >= m) for m in sorted(set(cfg.min_history))}
    heavy = {key: rows for key, rows in heavy.items() if rows.size}
    by_min_history = {key: _aggregate(main, rows, ks, n_items) for key, rows in heavy.items()}
    slices = {"all": np.arange(len(order)), **heavy}
    paired = {}
    for c, key in zip(sweep, keys):
        if key == FULL or by_context[key][metric_names(ks)[0]] is None or key in paired:
            continue
        paired[key] = _paired(main, run(int(c), f"context {key}"), slices, paired_metrics(ks), seed=0)

    tied_share = float(main.tied.mean())
    if tied_share > 0.01:
        msg = (
            f"{tied_share:.1%} of users have a target tied with another item; with ties='{cfg.ties}' "
            "their ranks depend on the tie rule"
        )
        notes.append(msg)
        logger.warning("%s: %s", scorer.name, msg)
    if cfg.exclude_seen:
        seen_targets = int(examples.select(pl.col(TARGETS).list.set_intersection(HISTORY).list.len() > 0).sum().item())
        if seen_targets:
            notes.append(
                f"{seen_targets} of {len(order)} users ({seen_targets / len(order):.1%}) have a target already in their "
                "history: with evaluate.exclude_seen=true it is masked and counts as a miss, as score never serves it "
                "(set exclude_seen=false to rank every item)"
            )
    seconds = time.perf_counter() - start
    logger.info("%s: evaluated %d users in %.1fs", scorer.name, len(order), seconds)
    return EvaluationResult(
        protocol=protocol_name,
        n_users=len(order),
        metrics=metrics,
        by_context_length=by_context,
        by_history_length=by_history,
        scorer=scorer.name,
        ks=tuple(ks),
        history_bucket_sizes=sizes,
        tied_share=tied_share,
        ties=cfg.ties,
        notes=tuple(notes),
        seconds=seconds,
        by_min_history=by_min_history,
        paired_vs_context=paired,
        per_user=dict(main.per_user),
        user_ids=examples[USER_ID].to_numpy(),
        history_lengths=hist_len.astype(np.int64),
    )
