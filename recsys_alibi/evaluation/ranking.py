"""Full-catalog ranking on score tensors: seen-item masking, target ranks, top-K.

Scores are (B, N+1) float: B users, column j = item index j (1..N), column 0 = padding and
never ranked. Each fast path has a plain reference beside it (``*_reference``); the tests hold
one against the other.

Protocol choices, stated once:

- **Seen items: one rule** for reports (``evaluate``), training validation, the promotion gate
  and what ``score`` / the pyfunc / Ray serve. With ``exclude_seen`` every item of the user's
  *whole* history (not only the model's input window) gets score -inf: it is never served and
  never counts as a hit. A held-out target that occurs earlier in the history
  (re-consumption) is masked like every other seen item and counts as a **miss**: its rank is
  ``MISS_RANK`` (beyond every K; HR@K, NDCG@K and Recall@K count it as not found, and its
  reciprocal rank for MRR is 0). The candidate set therefore never depends on the answer, and
  HR@K equals the hit rate of the top-K that ``score`` serves for the same context (``score``
  reads at most ``score.max_context`` events, sinks plus the most recent: a longer history is
  evaluated whole here unless ``evaluate.context_lengths`` cuts it too). With ``exclude_seen`` false
  every item is ranked, seen or not (the setting for data with re-consumption). More
  generally, a target whose score is -inf (masked, or so scored by the scorer) is a miss:
  ``score`` never serves an item at -inf.
- **Ties.** ``target_ranks`` returns ``1 + #items with a strictly higher score`` by default
  (``ties="optimistic"``): a target tied with other items is placed ahead of them. This is
  the convention of most public evaluation code, but note that it is *optimistic*: a
  degenerate scorer that gives every item the same score would get rank 1 everywhere. The
  evaluator therefore reports the share of users whose target was tied, and
  ``ties="pessimistic"`` (rank = #items with score >= the target's, i.e. behind all ties) is
  available to bound the effect. Several targets tied with one another take consecutive
  positions, so the ranks of one user are always distinct.
- **Top-K order.** ``topk`` and ``ChunkedTopK`` order by score descending and, among equal
  scores, by item index ascending; the result is deterministic and independent of the chunk
  size. Scores must not be NaN.
"""

from __future__ import annotations

from typing import Literal

import torch

from recsys_alibi.evaluation.metrics import MISS_RANK  # re-exported: ranks and metrics share it

__all__ = [
    "MISS_RANK",
    "ChunkedTopK",
    "Ties",
    "mask_seen",
    "mask_seen_reference",
    "target_ranks",
    "target_ranks_reference",
    "topk",
    "topk_reference",
]

Ties = Literal["optimistic", "pessimistic"]
_NEG_INF = float("-inf")


def mask_seen(
    scores: torch.Tensor,
    history: torch.Tensor,
    exclude_seen: bool = True,
    *,
    offset: int = 0,
) -> torch.Tensor:
    """Set the padding column and (with ``exclude_seen``) every seen item to -inf, **in place**.

    The one seen-item rule (module docstring): nothing is kept rankable, held-out targets
    included, so the candidate set never depends on the answer.

    Args:
        scores: (B, C) float; column j holds item ``offset + j``. C = N+1 and offset 0 for the
            full catalog; a catalog chunk otherwise (then column 0 is padding only if offset 0).
        history: (B, L) int64 item indices of the user's whole history, right-padded with 0
            (padding is ignored).
        exclude_seen: mask the history items; the padding column is masked regardless.
        offset: item index of column 0 (for catalog chunks).

    Returns:
        ``scores`` itself, modified in place; a copy when ``scores`` is an inference tensor
        (made under ``torch.inference_mode``) and inference mode is off now, since such
        tensors cannot be written in place. Always use the returned tensor.

    Raises:
        ValueError: ``scores`` is not (B, C) or ``history`` not (B, L).
    """
    if scores.is_inference() and not torch.is_inference_mode_enabled():
        scores = scores.clone()
    if scores.ndim != 2 or history.ndim != 2 or history.shape[0] != scores.shape[0]:
        raise ValueError(f"scores (B, C) and history (B, L) expected, got {tuple(scores.shape)}, {tuple(history.shape)}")
    n_rows, n_cols = scores.shape
    if exclude_seen and history.numel():
        history = history.to(scores.device, torch.int64)
        if offset == 0 and int(history.max()) < n_cols and int(history.min()) >= 0:
            scores.scatter_(1, history, _NEG_INF)  # padding 0 hits column 0, masked anyway
        else:
            rows = torch.arange(n_rows, device=scores.device).unsqueeze(1).expand_as(history)
            cols = history - offset
            inside = (history > 0) & (cols >= 0) & (cols < n_cols)
            scores[rows[inside], cols[inside]] = _NEG_INF
    if offset == 0 and n_cols:
        scores[:, 0] = _NEG_INF
    return scores


def mask_seen_reference(scores: torch.Tensor, history: torch.Tensor, exclude_seen: bool = True) -> torch.Tensor:
    """Row-by-row Python version of ``mask_seen`` (full catalog, offset 0); returns a copy."""
    out = scores.clone()
    for b in range(out.shape[0]):
        if exclude_seen:
            for item in history[b].tolist():
                if item > 0:
                    out[b, item] = _NEG_INF
        out[b, 0] = _NEG_INF
    return out


def _distinct_positions(ranks: torch.Tensor, valid: torch.Tensor, ties: Ties) -> torch.Tensor:
    """Spread equal ranks of one row (targets tied with one another) over consecutive positions.

    ``optimistic`` moves later members of a tie group down (r, r+1, ...); ``pessimistic``
    moves earlier members up (..., r-1, r). Rows are independent; invalid slots are ignored.
    """
    sign = 1 if ties == "optimistic" else -1
    big = torch.iinfo(torch.int64).max // 4
    key = torch.where(valid, sign * ranks, torch.full_like(ranks, big))
    sorted_key, order = torch.sort(key, dim=1, stable=True)
    step = torch.arange(ranks.shape[1], device=ranks.device).unsqueeze(0)
    spread = torch.cummax(sorted_key - step, dim=1).values + step  # x_i = max(x_i, x_{i-1} + 1)
    out = torch.empty_like(ranks).scatter_(1, order, spread)
    return torch.where(valid, sign * out, torch.zeros_like(ranks))


def target_ranks(scores: torch.Tensor, targets: torch.Tensor, ties: Ties = "optimistic") -> torch.Tensor:
    """1-based rank of each target among all columns of its row; ``MISS_RANK`` for a -inf target.

    Args:
        scores: (B, N+1) float, already masked (masked items at -inf); no NaN.
        targets: (B,) int64 item indices, or (B, T) int64 right-padded with 0 (several targets).
        ties: ``"optimistic"``: rank = 1 + #columns with a strictly higher score;
            ``"pessimistic"``: rank = #columns with a score >= the target's (see module doc).

    Returns:
        Same shape as ``targets``, int64. A target scored -inf (a masked seen item) is a miss:
        ``MISS_RANK`` (module docstring). For (B, T) input: 0 for padding slots and for repeats
        of a target already earlier in the row (each item counts once); targets tied with each
        other get consecutive ranks, so the ranks of a row are distinct (misses aside).
    """
    if ties not in ("optimistic", "pessimistic"):
        raise ValueError(f"ties must be 'optimistic' or 'pessimistic', got {ties!r}")
    targets = targets.to(scores.device, torch.int64)
    if targets.ndim == 1:
        t_scores = scores.gather(1, targets.unsqueeze(1))  # (B, 1)
        if ties == "optimistic":
            ranks = 1 + (scores > t_scores).sum(dim=1)
        else:
            ranks = (scores >= t_scores).sum(dim=1)
        return torch.where(torch.isneginf(t_scores[:, 0]), MISS_RANK, ranks)
    if targets.ndim != 2:
        raise ValueError(f"targets must be (B,) or (B, T), got shape {tuple(targets.shape)}")
    # count greater / greater-or-equal columns by binary search in each sorted row
    sorted_scores = torch.sort(scores, dim=1).values  # (B, N+1) ascending
    t_scores = scores.gather(1, targets).contiguous()  # (B, T)
    n_cols = scores.shape[1]
    if ties == "optimistic":
        ranks = 1 + n_cols - torch.searchsorted(sorted_scores, t_scores, right=True)
    else:
        ranks = n_cols - torch.searchsorted(sorted_scores, t_scores, right=False)
    sorted_t, order = torch.sort(targets, dim=1, stable=True)  # first occurrence stays first
    dup = torch.zeros_like(sorted_t, dtype=torch.bool)
    dup[:, 1:] = sorted_t[:, 1:] == sorted_t[:, :-1]
    repeat = torch.zeros_like(dup).scatter_(1, order, dup)  # (B, T): repeat of an earlier slot
    valid = (targets > 0) & ~repeat
    missed = valid & torch.isneginf(t_scores)  # masked targets take no position among the others
    return torch.where(missed, MISS_RANK, _distinct_positions(ranks, valid & ~missed, ties))


def target_ranks_reference(scores: torch.Tensor, targets: torch.Tensor, ties: Ties = "optimistic") -> torch.Tensor:
    """Python-loop version of ``target_ranks`` (same shapes, same tie, repeat and miss rules)."""
    two_d = targets.ndim == 2
    t2 = targets.reshape(targets.shape[0], -1)
    out = torch.zeros_like(t2, dtype=torch.int64)
    for b in range(scores.shape[0]):
        row = scores[b].tolist()
        seen: set[int] = set()
        taken: set[int] = set()
        slots = [(j, int(t)) for j, t in enumerate(t2[b].tolist()) if (t > 0 or not two_d)]
        firsts = []
        for j, t in slots:
            if t in seen:
                continue
            seen.add(t)
            if row[t] == _NEG_INF:  # masked: a miss, no position taken
                out[b, j] = MISS_RANK
                continue
            firsts.append((j, t))
        # tied targets: optimistic spreads downward in rank order, pessimistic upward
        raw = []
        for j, t in firsts:
            s = row[t]
            r = 1 + sum(x > s for x in row) if ties == "optimistic" else sum(x >= s for x in row)
            raw.append((r, j))
        order = sorted(raw) if ties == "optimistic" else sorted(raw, key=lambda x: (-x[0], x[1]))
        for r, j in order:
            if two_d:
                step = 1 if ties == "optimistic" else -1
                while r in taken:
                    r += step
                taken.add(r)
            out[b, j] = r
    return out if two_d else out[:, 0]


def topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-K columns per row, best first; ties broken by the lower column index.

    Args:
        scores: (B, C) float, no NaN.
        k: number of columns kept; clipped to C.

    Returns:
        values (B, K) in scores.dtype, indices (B, K) int64 column indices (K = min(k, C)).
    """
    b, n_cols = scores.shape
    k = min(int(k), n_cols)
    if k <= 0 or b == 0:
        return scores.new_empty(b, max(k, 0)), torch.empty(b, max(k, 0), dtype=torch.int64, device=scores.device)
    if k < n_cols:  # common case: no tie among the first k+1 values -> torch.topk is already exact
        vals, cols = torch.topk(scores, k + 1, dim=1, sorted=True)
        tied = (vals[:, 1:] == vals[:, :-1]).any(dim=1)  # (B,) rows that need the tie rule
        if not bool(tied.any()):
            return vals[:, :k], cols[:, :k]
        if not bool(tied.all()):  # only the tied rows take the slower exact path
            vals, cols = vals[:, :k].clone(), cols[:, :k].clone()
            vals[tied], cols[tied] = _topk_ties(scores[tied], k)
            return vals, cols
    return _topk_ties(scores, k)


def _topk_ties(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk`` for rows with ties: lowest column indices first among equal scores (1 <= k <= C)."""
    b = scores.shape[0]
    kth = torch.topk(scores, k, dim=1, sorted=False).values.min(dim=1, keepdim=True).values  # (B, 1)
    above = scores > kth
    at = scores == kth
    need = k - above.sum(dim=1, keepdim=True)  # slots left for items tied at the threshold
    chosen = above | (at & (torch.cumsum(at, dim=1) <= need))  # lowest indices among the ties
    cols = chosen.nonzero()[:, 1].reshape(b, k)  # ascending column index per row
    vals = scores.gather(1, cols)
    order = torch.sort(vals, dim=1, descending=True, stable=True).indices  # stable: index asc
    return vals.gather(1, order), cols.gather(1, order)


def topk_reference(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort-based reference for ``topk``: a stable full sort, first K columns."""
    k = min(int(k), scores.shape[1])
    vals, idx = torch.sort(scores, dim=1, descending=True, stable=True)
    return vals[:, :k], idx[:, :k]


class ChunkedTopK:
    """Running top-K over catalog chunks: memory O(B*(K + chunk)), independent of N.

    Feed the scores of each chunk of columns (any order, each column once); ``result`` gives
    the same values and indices as ``topk`` on the whole (B, N+1) matrix, ties included.

    Example (B users, D width, item table (N+1, D))::

        running = ChunkedTopK(k=100)
        for start in range(0, n_items + 1, chunk):
            part = hidden @ table[start:start + chunk].T          # (B, C)
            mask_seen(part, history, offset=start)
            running.update(part, offset=start)
        values, items = running.result()                          # (B, K), (B, K) int64
    """

    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k = int(k)
        self._values: torch.Tensor | None = None  # (B, K') best so far
        self._indices: torch.Tensor | None = None  # (B, K') int64 item indices

    def update(self, scores: torch.Tensor, offset: int = 0) -> None:
        """Merge the chunk ``scores`` (B, C), whose column j is item ``offset + j``."""
        vals, idx = topk(scores, self.k)
        idx = idx + offset
        if self._values is None:
            self._values, self._indices = vals, idx
            return
        assert self._indices is not None
        if vals.shape[0] != self._values.shape[0]:
            raise ValueError(f"chunk has {vals.shape[0]} rows, expected {self._values.shape[0]}")
        vals = torch.cat([self._values, vals], dim=1)
        idx = torch.cat([self._indices, idx], dim=1)
        by_index = torch.sort(idx, dim=1, stable=True).indices  # ties must end up index-ascending
        vals, idx = vals.gather(1, by_index), idx.gather(1, by_index)
        by_score = torch.sort(vals, dim=1, descending=True, stable=True).indices[:, : self.k]
        self._values, self._indices = vals.gather(1, by_score), idx.gather(1, by_score)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """values (B, K) and item indices (B, K) int64, best first."""
        if self._values is None or self._indices is None:
            raise ValueError("ChunkedTopK.result() called before any update()")
        return self._values, self._indices
