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
    seen = seen.to(hidden.device, torch.int64)
    running = ChunkedTopK(k)
    blocks = row_blocks(hidden)  # (B', D) in blocks of ROW_BLOCK rows
    for start in range(0, table.shape[0], chunk):
        part = table[start : start + chunk].T  # (D, C)
        scores = torch.cat([block @ part for block in blocks])[: hidden.shape[0]].float()  # (B, C)
        scores = mask_seen(scores, seen, exclude_seen=exclude_seen, offset=start)
        if mask is not None:
            scores = mask.apply(scores, offset=start)
        running.update(scores, offset=start)
    return running.result()


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
