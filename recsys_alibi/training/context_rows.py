"""New item rows imprinted from the contexts the items were chosen in (warm start, ``train.warm.new_item_rows``).

The item table is tied to the output: item ``j`` scores ``h . e_j`` after a history whose hidden state
is ``h``. A new item (not in the parent model's vocabulary) has no trained row; the default rule draws
one at random (:func:`recsys_alibi.training.warm_start.new_item_rows`), so it starts ranked like an
arbitrary item and the short warm run must find its place. Its place is known before training: every
occurrence of ``j`` in the training part of the new data follows a history, and the parent model's
hidden state after that history (its items the parent knows; the new ones are dropped, as the promotion
gate drops them) is where ``j`` should score high. :func:`imprinted_rows` sets

    e_j = mu + s * (m_j - m) / ||m_j - m||

``m_j`` the mean hidden state before ``j``'s occurrences, ``m`` the mean over every new item's
occurrences (the part common to all contexts, which would make ``j`` score high for everyone), ``mu``
the mean trained row and ``s`` the trained rows' mean distance from it: a row of a typical norm pointed
at ``j``'s contexts. Imprinting in the sense of Qi, Brown & Lowe, "Low-Shot Learning with Imprinted
Weights", CVPR 2018 (arXiv 1712.07136): a new class's output weights set from the normalised mean
embedding of its examples. Items with no occurrence in the training part keep the random rule.
"""

from __future__ import annotations

import numpy as np
import torch

from recsys_alibi.data.loader import FlatSequences
from recsys_alibi.data.time_gaps import gap_buckets


MAX_CONTEXTS = 64  # contexts per new item: a mean of 64 states is settled; bounds the cost on large logs


def occurrence_contexts(
    items: FlatSequences, timestamps: FlatSequences | None, remap: np.ndarray, new: np.ndarray, max_len: int,
    max_per_item: int = MAX_CONTEXTS,
) -> tuple[list[np.ndarray], list[np.ndarray] | None, np.ndarray]:
    """The parent's input before the occurrences of each new item (after at least one known item), at most
    ``max_per_item`` per item (the first ones in user order), so the cost is bounded by
    ``max_per_item x new items`` forward passes of at most ``max_len`` items.

    Args:
        items: U training histories in the new vocabulary (int item_idx, time order).
        timestamps: their int64 seconds (same offsets), or None when the parent reads no time gaps.
        remap: (N + 1,) int64 new item_idx -> the parent's item_idx, 0 for an item it does not know.
        new: (N + 1,) bool, True for the items to imprint.
        max_len: the parent's window (items): each context is the last ``max_len`` known items.

    Returns:
        ``(contexts, context_times, targets)``: C arrays of the parent's item_idx, their timestamps
        (None without ``timestamps``), and (C,) int64 the new item_idx each context precedes.
    """
    contexts, times, targets = [], [] if timestamps is not None else None, []
    taken = np.zeros(new.size, dtype=np.int64)  # contexts so far per item
    for u in range(len(items)):
        row = np.asarray(items.get(u), dtype=np.int64)
        hits = np.flatnonzero(new[row])
        if hits.size == 0:
            continue
        known = remap[row] > 0
        seconds = np.asarray(timestamps.get(u), dtype=np.int64) if timestamps is not None else None
        for p in hits:
            before = np.flatnonzero(known[:p])[-max_len:]
            if before.size == 0 or taken[row[p]] >= max_per_item:
                continue
            taken[row[p]] += 1
            contexts.append(remap[row[before]])
            if times is not None:
                times.append(seconds[before])
            targets.append(int(row[p]))
    return contexts, times, np.asarray(targets, dtype=np.int64)


@torch.no_grad()
def context_means(
    model, contexts: list[np.ndarray], times: list[np.ndarray] | None, targets: np.ndarray, n_rows: int,
    batch_size: int = 256,
) -> tuple[torch.Tensor, np.ndarray, torch.Tensor]:
    """Mean hidden state of ``model`` after the contexts of each target item.

    Args:
        model: the parent ``AlibiRanker`` (its ``last_hidden``; time gaps from ``times`` when it reads them).
        contexts, times, targets: from :func:`occurrence_contexts` (C contexts).
        n_rows: N + 1, the rows of the new table.

    Returns:
        ``(means, counts, overall)``: (N + 1, D) float32 mean per target row (0 where no context),
        (N + 1,) int64 contexts per row, and (D,) float32 the mean over all C contexts.
    """
    buckets = getattr(model.items, "time_gap_buckets", 0)
    sizes = np.array([c.size for c in contexts], dtype=np.int64)
    gaps_of = (  # every context's gap buckets at once: (C,) sequences with the offsets of ``contexts``
        gap_buckets(FlatSequences(values=np.concatenate(times), offsets=np.r_[0, np.cumsum(sizes)]), buckets)
        if buckets and contexts else None
    )  # fmt: skip
    sums = torch.zeros(n_rows, model.cfg.d_model)
    was_training = model.training
    model.eval()
    for first in range(0, len(contexts), batch_size):
        chunk = contexts[first : first + batch_size]
        lengths = torch.from_numpy(sizes[first : first + batch_size])
        padded = torch.zeros(len(chunk), int(lengths.max()), dtype=torch.int64)
        gaps = torch.zeros_like(padded) if gaps_of is not None else None
        for r, c in enumerate(chunk):
            padded[r, : c.size] = torch.from_numpy(c)
            if gaps is not None:
                gaps[r, : c.size] = torch.from_numpy(np.asarray(gaps_of.get(first + r)))
        hidden = model.last_hidden(padded, lengths, gaps=gaps).float()  # (b, D)
        sums.index_add_(0, torch.from_numpy(targets[first : first + batch_size]), hidden)
    model.train(was_training)
    counts = np.bincount(targets, minlength=n_rows).astype(np.int64)
    overall = sums.sum(0) / max(1, len(contexts))
    return sums / torch.from_numpy(np.maximum(counts, 1)).float()[:, None], counts, overall


def imprinted_rows(trained: torch.Tensor, means: torch.Tensor, overall: torch.Tensor) -> torch.Tensor:
    """Rows ``mu + s * unit(means - overall)`` (module doc).

    Args:
        trained: (N_old, D) the parent's item rows (padding excluded).
        means: (K, D) mean context states of K new items; overall: (D,) their common part.

    Returns:
        (K, D) float32 rows, dtype of ``trained``.

    >>> rows = imprinted_rows(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]), torch.tensor([[0.0, 3.0]]), torch.zeros(2))
    >>> rows.tolist()
    [[0.0, 1.0]]
    """
    mu = trained.float().mean(0)
    spread = (trained.float() - mu).norm(dim=1).mean()
    direction = means.float() - overall.float()
    direction = direction / direction.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return (mu + spread * direction).to(trained.dtype)
