"""Packing several users' sequences into rows of a fixed token budget.

A packed row holds whole sequences one after another, right-padded with id 0; ``seq_ids`` tell
the attention (``alibi_attention(..., seq_ids=...)``) which positions belong together. ALiBi
only sees distances inside one sequence, so no position offsets are needed and a sequence's
output does not depend on what it was packed with.

Sequences longer than the budget are truncated to their LAST ``token_budget`` tokens (the most
recent events) by default; ``truncate=False`` makes that an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["PackPlan", "PackedBatch", "batch_padding_waste", "pack_items", "pack_sequences", "padding_waste"]


def _as_lengths(lengths: Sequence[int] | Tensor | np.ndarray) -> np.ndarray:
    arr = lengths.detach().cpu().numpy() if isinstance(lengths, Tensor) else np.asarray(lengths)
    arr = arr.astype(np.int64).reshape(-1)
    if arr.size and arr.min() < 1:
        raise ValueError(f"every sequence needs at least one token; sequence {int(arr.argmin())} is empty")
    return arr


@dataclass(frozen=True)
class PackPlan:
    """Where each sequence goes: row and starting column in a (n_rows, token_budget) grid.

    Attributes:
        token_budget: T, tokens per row.
        lengths: (S,) tokens of each sequence after truncation to T.
        row: (S,) row of each sequence. offset: (S,) first column of each sequence.
        n_rows: R. n_truncated: how many sequences were cut to their last T tokens.
    """

    token_budget: int
    lengths: tuple[int, ...]
    row: tuple[int, ...]
    offset: tuple[int, ...]
    n_rows: int
    n_truncated: int = 0

    @property
    def n_tokens(self) -> int:
        """Real (non-padding) tokens placed."""
        return int(sum(self.lengths))

    @property
    def padding_waste(self) -> float:
        """Fraction of the R x T grid that is padding."""
        cells = self.n_rows * self.token_budget
        return 0.0 if cells == 0 else 1.0 - self.n_tokens / cells

    def rows(self) -> list[list[int]]:
        """Sequence indices of every row, in column order."""
        out: list[list[int]] = [[] for _ in range(self.n_rows)]
        for s in sorted(range(len(self.row)), key=lambda s: (self.row[s], self.offset[s])):
            out[self.row[s]].append(s)
        return out


def pack_sequences(
    lengths: Sequence[int] | Tensor,
    token_budget: int,
    *,
    order: Literal["decreasing", "given"] = "decreasing",
    truncate: bool = True,
) -> PackPlan:
    """Plan rows of ``token_budget`` tokens by first fit.

    Each sequence goes to the first row with room, opening a row when none has; with
    ``order="decreasing"`` sequences are placed longest first (first-fit decreasing, at most
    ~11/9 of the optimal row count), with ``"given"`` in input order. Cost O(S x R), meant for
    one batch or shard at a time.

    Args:
        lengths: (S,) int, tokens per sequence, each >= 1.
        token_budget: T >= 1.
        order: placement order.
        truncate: cut sequences longer than T to T tokens (the last T when the tokens are laid
            out by :func:`pack_items`); when False such a sequence is an error.

    Returns:
        :class:`PackPlan`.

    Raises:
        ValueError: T < 1, an empty sequence, or (``truncate=False``) a sequence longer than T.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    lens = _as_lengths(lengths)
    too_long = lens > token_budget
    if too_long.any() and not truncate:
        s = int(np.flatnonzero(too_long)[0])
        raise ValueError(f"sequence {s} has {int(lens[s])} tokens > token_budget {token_budget}")
    lens = np.minimum(lens, token_budget)
    placement = np.argsort(-lens, kind="stable") if order == "decreasing" else np.arange(len(lens))
    free = np.empty(max(1, len(lens)), dtype=np.int64)  # room left per open row
    n_rows = 0
    row = np.zeros(len(lens), dtype=np.int64)
    offset = np.zeros(len(lens), dtype=np.int64)
    for s in placement:
        n = lens[s]
        fits = np.flatnonzero(free[:n_rows] >= n)
        if fits.size:
            r = int(fits[0])
        else:
            r, n_rows = n_rows, n_rows + 1
            free[r] = token_budget
        row[s], offset[s] = r, token_budget - free[r]
        free[r] -= n
    return PackPlan(
        token_budget=token_budget,
        lengths=tuple(int(x) for x in lens),
        row=tuple(int(x) for x in row),
        offset=tuple(int(x) for x in offset),
        n_rows=n_rows,
        n_truncated=int(too_long.sum()),
    )


class PackedBatch(NamedTuple):
    """Packed rows of item indices.

    tokens: (R, T) int64 item indices, 0 = padding. seq_ids: (R, T) int64, sequence ``s`` has
    id ``s + 1``, 0 = padding. last: (S, 2) int64 ``[row, column]`` of each sequence's last
    token (``hidden[last[:, 0], last[:, 1]]`` gives (S, D)). plan: the :class:`PackPlan`.
    """

    tokens: Tensor
    seq_ids: Tensor
    last: Tensor
    plan: PackPlan


def pack_items(
    items: Sequence[Tensor],
    token_budget: int,
    *,
    plan: PackPlan | None = None,
    order: Literal["decreasing", "given"] = "decreasing",
    truncate: bool = True,
) -> PackedBatch:
    """Lay 1-D item sequences out in packed rows (right padding within a row).

    Args:
        items: S tensors (L_s,) of integer item indices (1-based; 0 is padding).
        token_budget: T, the row width.
        plan: a plan from :func:`pack_sequences` for these lengths (made here when None).
        order, truncate: as :func:`pack_sequences`; a truncated sequence keeps its last T items.

    Returns:
        :class:`PackedBatch` with tensors on the CPU.

    Raises:
        ValueError: as :func:`pack_sequences`, or a ``plan`` that does not match ``items``.
    """
    lens = [int(t.numel()) for t in items]
    if plan is None:
        plan = pack_sequences(lens, token_budget, order=order, truncate=truncate)
    elif plan.token_budget != token_budget or list(plan.lengths) != [min(n, token_budget) for n in lens]:
        raise ValueError("plan does not match the items' lengths and token_budget")
    tokens = torch.zeros(plan.n_rows, token_budget, dtype=torch.int64)
    seq_ids = torch.zeros(plan.n_rows, token_budget, dtype=torch.int64)
    last = torch.zeros(len(items), 2, dtype=torch.int64)
    for s, seq in enumerate(items):
        n, r, c = plan.lengths[s], plan.row[s], plan.offset[s]
        tokens[r, c : c + n] = seq.reshape(-1)[-n:].to(torch.int64)
        seq_ids[r, c : c + n] = s + 1
        last[s, 0], last[s, 1] = r, c + n - 1
    return PackedBatch(tokens, seq_ids, last, plan)


def padding_waste(lengths: Sequence[int] | Tensor, width: int) -> float:
    """Padding fraction when every sequence gets its own row of ``width`` (cut to ``width``).

    Args:
        lengths: (S,) int, each >= 1. width: row width >= 1.

    Returns:
        ``1 - sum(min(L_s, width)) / (S * width)``; 0.0 for no sequences.
    """
    lens = np.minimum(_as_lengths(lengths), width)
    return 0.0 if lens.size == 0 else 1.0 - float(lens.sum()) / (lens.size * width)


def batch_padding_waste(lengths: Sequence[int] | Tensor, batch_size: int, max_len: int | None = None) -> float:
    """Padding fraction when consecutive batches of ``batch_size`` sequences are each padded to
    their own longest sequence (dynamic padding), lengths cut to ``max_len`` first.

    Returns:
        padding cells / all cells, over all batches; 0.0 for no sequences.
    """
    lens = _as_lengths(lengths)
    if max_len is not None:
        lens = np.minimum(lens, max_len)
    batches = [lens[i : i + batch_size] for i in range(0, len(lens), batch_size)]
    cells = sum(int(b.max()) * len(b) for b in batches)
    return 0.0 if cells == 0 else 1.0 - float(lens.sum()) / cells
