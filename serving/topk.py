"""Top-K items per user over a catalog scored in chunks, and its full-matrix reference.

``chunked_topk`` never holds the (B, N + 1) score matrix: it multiplies the hidden states with
``catalog_chunk`` rows of the item table at a time, masks the padding column and the seen items
of that chunk, and merges the chunk into a running top-K
(:class:`recsys_alibi.evaluation.ranking.ChunkedTopK`). Working memory is
O(B * (chunk + K) + B * S), independent of the catalog size N. Ties are broken by the lower item
index, so the result does not depend on the chunk size. ``topk_reference`` builds the whole
matrix and is what the tests hold the chunked path against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from recsys_alibi.evaluation.ranking import ChunkedTopK, mask_seen, topk

if TYPE_CHECKING:
    from serving.rules import ItemMask


ROW_BLOCK = 64


def row_blocks(hidden: torch.Tensor) -> list[torch.Tensor]:
    """(B, D) -> ceil(B / ROW_BLOCK) blocks of exactly (ROW_BLOCK, D), the last one zero-padded.

    Every user's row is multiplied in a product of one shape, whatever the batch size, so its
    scores are the same bits in any batch (a (7, D) and a (40, D) product differ by ~3e-8 on the
    CPU: the kernel's blocking depends on the shape).
    """
    padded = -(-hidden.shape[0] // ROW_BLOCK) * ROW_BLOCK
    if padded != hidden.shape[0]:
        hidden = torch.cat([hidden, hidden.new_zeros((padded - hidden.shape[0], hidden.shape[1]))])
    return list(hidden.split(ROW_BLOCK))


def chunked_topk(
    hidden: torch.Tensor,
    table: torch.Tensor,
    seen: torch.Tensor,
    k: int,
    *,
    chunk: int,
    exclude_seen: bool = True,
    mask: ItemMask | None = None,
    first_item: int = 0,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Best ``k`` items of each row, scoring the catalog ``chunk`` items at a time.

    Args:
        hidden: (B, D) float, user states (e.g. ``AlibiRanker.last_hidden``).
        table: (N + 1, D) float, the item table; row 0 is padding and is never ranked.
        seen: (B, S) int64 item indices of each user's history, right-padded with 0 (all of the
            history, not only the context the model saw).
        k: items kept per row (>= 1).
        chunk: catalog rows scored at once (>= 1).
        exclude_seen: give every seen item -inf (never ranked): the one seen-item rule of
            ``recsys_alibi.evaluation.ranking``, so what is served here is what ``evaluate``
            counts as a hit.
        mask: business rules of these B rows (:class:`serving.rules.ItemMask`): denied and
            not-allowed items get -inf too, per chunk, before the running top-K.
        first_item: rank only the items ``first_item .. N`` (e.g. the new items of
            :func:`reserve_new_items`), with the same chunks as the whole catalog, so each score has the
            same bits as there; 0: the whole catalog.
        bias: (N + 1,) float32 added to every row's item scores (``score.popularity_prior``); None: none.

    Returns:
        values (B, K') float32 and item indices (B, K') int64, best first, K' = min(k, N + 1).
        Masked items carry -inf: a row with fewer than K' rankable items ends in -inf entries,
        which callers drop.

    Raises:
        ValueError: k or chunk < 1, or mismatched shapes.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if hidden.ndim != 2 or table.ndim != 2 or hidden.shape[1] != table.shape[1]:
        raise ValueError(f"hidden (B, D) and table (N + 1, D) expected, got {tuple(hidden.shape)}, {tuple(table.shape)}")
    if bias is not None and tuple(bias.shape) != (table.shape[0],):
        raise ValueError(f"bias (N + 1,) = ({table.shape[0]},) expected, got {tuple(bias.shape)}")
    seen = seen.to(hidden.device, torch.int64)
    running = ChunkedTopK(k)
    blocks = row_blocks(hidden)  # (B', D) in blocks of ROW_BLOCK rows
    # from first_item: the same chunk grid as the whole catalog's (products of the same shapes, so the same bits)
    for start in range(first_item // chunk * chunk, table.shape[0], chunk):
        part = table[start : start + chunk].T  # (D, C)
        scores = torch.cat([block @ part for block in blocks])[: hidden.shape[0]].float()  # (B, C)
        if bias is not None:
            scores = scores + bias[start : start + chunk].to(scores.device)[None, :]
        if start < first_item:
            scores[:, : first_item - start] = float("-inf")
        scores = mask_seen(scores, seen, exclude_seen=exclude_seen, offset=start)
        if mask is not None:
            scores = mask.apply(scores, offset=start)
        running.update(scores, offset=start)
    return running.result()


def reserve_new_items(
    values: torch.Tensor, indices: torch.Tensor, new_values: torch.Tensor, new_indices: torch.Tensor, slots: int,
    first_new: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hold up to ``slots`` places of each top-K for new items (``score.new_item_slots``).

    New items (indices ``>= first_new``: those the model never saw, ranked from their features alone)
    already in a row's top-K stay in it, in their order. When a row holds fewer than ``slots`` of them,
    its lowest-ranked other items give way to the best new items not in it yet, which take the last
    places in their own order: a slot item may score below the item above it. A row ends with
    ``min(slots, K, rankable new items)`` new items at least. A business rule of exploration slots (the
    "fresh" places of feeds that add items daily); measured in docs/results.md ("A place held for a new
    item").

    Args:
        values, indices: (B, K) float and int64, a top-K best first (``-inf`` on a masked tail).
        new_values, new_indices: (B, S) the best ``S >= min(slots, K)`` new items of each row, best first
            (``-inf``: masked by a rule, never placed).
        slots: places held per row (>= 0); 0 returns the top-K as it is.
        first_new: the first new item's index (items ``first_new .. N`` are new).

    Returns:
        values, indices (B, K), the same dtypes.

    Raises:
        ValueError: ``slots`` < 0, or fewer than ``min(slots, K)`` new-item columns.
    """
    slots = min(int(slots), values.shape[1])
    if slots < 0 or new_indices.shape[1] < slots:
        raise ValueError(f"slots must be in 0 .. {new_indices.shape[1]} (the new-item columns), got {slots}")
    if slots == 0:
        return values, indices
    values, indices = values.clone(), indices.clone()
    finite = torch.isfinite(values)
    new = (indices >= first_new) & finite  # (B, K)
    for row in torch.nonzero(new.sum(1) < slots).flatten().tolist():
        top = set(indices[row][finite[row]].tolist())
        fresh = [j for j in range(new_indices.shape[1])
                 if bool(torch.isfinite(new_values[row, j])) and int(new_indices[row, j]) not in top]  # fmt: skip
        need = min(slots - int(new[row].sum()), len(fresh))
        if need <= 0:
            continue
        others = torch.nonzero(~new[row]).flatten().tolist()  # finite: a row with a -inf tail has no new item left
        keep = sorted(set(range(values.shape[1])) - set(others[-need:]))
        order = [(values[row, p], indices[row, p]) for p in keep] + [(new_values[row, j], new_indices[row, j]) for j in fresh[:need]]
        values[row] = torch.stack([v for v, _ in order])
        indices[row] = torch.stack([i for _, i in order])
    return values, indices


def slotted_ranks(
    scores: torch.Tensor, targets: torch.Tensor, ranks: torch.Tensor, k: int, slots: int, first_new: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each target stands in a top ``k`` with ``slots`` places held for new items (evaluation of
    :func:`reserve_new_items` on a full score matrix).

    Args:
        scores: (B, N + M + 1) float, masked items at -inf; new items are the columns ``first_new ..``.
        targets: (B,) int64 target columns; ranks: (B,) int64 their ranks in the plain ranking.

    Returns:
        ranks (B,) int64: a target's place in the slotted top k, else its plain rank but at least k + 1
        (exact for metrics at k, not at other cut-offs); and the slotted top-k columns (B, k).
    """
    from recsys_alibi.evaluation.ranking import topk

    values, columns = topk(scores, k)  # (B, k)
    new = scores.shape[1] - first_new
    if not slots or new <= 0:
        return ranks, columns
    fresh_values, fresh_columns = topk(scores[:, first_new:], min(slots, new))
    _, columns = reserve_new_items(values, columns, fresh_values, fresh_columns + first_new, slots, first_new)
    found = columns == targets[:, None]  # (B, k)
    return torch.where(found.any(1), found.int().argmax(1) + 1, torch.clamp(ranks, min=k + 1)), columns


def topk_reference(
    hidden: torch.Tensor, table: torch.Tensor, seen: torch.Tensor, k: int, *, exclude_seen: bool = True,
    mask: ItemMask | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-matrix version of :func:`chunked_topk`: (B, N + 1) scores, mask, one top-K."""
    scores = (hidden @ table.T).float()  # (B, N + 1)
    scores = mask_seen(scores, seen.to(hidden.device, torch.int64), exclude_seen=exclude_seen)
    if mask is not None:
        scores = mask.apply(scores)
    return topk(scores, k)
