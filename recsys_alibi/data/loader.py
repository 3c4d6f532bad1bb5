"""Arrow-backed sequence datasets and right-padded batches for training and scoring.

Histories are kept as one flat int64 array of item indices plus (U + 1,) offsets (the Arrow
list layout), so a dataset of a billion events is two arrays, not a billion Python objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.utils.data import Dataset

if TYPE_CHECKING:  # the loader itself runs without polars (the GPU benchmark reads Parquet with pyarrow)
    import polars as pl
    import pyarrow as pa


@dataclass(frozen=True)
class FlatSequences:
    """U variable-length int sequences: ``values[offsets[u]:offsets[u + 1]]`` is sequence u.

    values: (total events,) int64; offsets: (U + 1,) int64, non-decreasing, offsets[0] == 0.
    """

    values: np.ndarray
    offsets: np.ndarray

    @classmethod
    def from_series(cls, series: pl.Series) -> "FlatSequences":
        """From a Polars ``list<int>`` column without materialising Python lists."""
        return cls.from_arrow(series.to_arrow())

    @classmethod
    def from_arrow(cls, arrow: pa.Array | pa.ChunkedArray) -> "FlatSequences":
        """From an Arrow ``list<int>`` array (e.g. a Parquet column read with pyarrow), zero-copy where it can."""
        if hasattr(arrow, "combine_chunks"):
            arrow = arrow.combine_chunks()
        offsets = arrow.offsets.to_numpy().astype(np.int64)
        values = arrow.values.to_numpy(zero_copy_only=False).astype(np.int64)
        return cls(values=values[offsets[0] : offsets[-1]], offsets=offsets - offsets[0])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        """(U,) int64 length of each sequence."""
        return np.diff(self.offsets)

    def padded(self, rows: np.ndarray, last: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The last ``last`` elements of the sequences ``rows``, right-padded with 0 (vectorised).

        Returns:
            (B, L) int64 with L = the longest kept sequence, and (B,) int64 kept lengths.
        """
        rows = np.asarray(rows, dtype=np.int64)
        ends = self.offsets[rows + 1]
        keep = ends - self.offsets[rows]
        if last is not None:
            keep = np.minimum(keep, last)
        width = int(keep.max()) if keep.size else 0
        step = np.arange(width)
        inside = step[None, :] < keep[:, None]  # (B, L)
        idx = np.where(inside, (ends - keep)[:, None] + step[None, :], 0)
        out = np.where(inside, self.values[idx], 0) if self.values.size else np.zeros(inside.shape, np.int64)
        return torch.from_numpy(out.astype(np.int64)), torch.from_numpy(keep.astype(np.int64))

    def get(self, u: int, last: int | None = None) -> np.ndarray:
        """Sequence u, or its last ``last`` elements."""
        start, end = self.offsets[u], self.offsets[u + 1]
        if last is not None:
            start = max(start, end - last)
        return self.values[start:end]


def pad_right(rows: list[np.ndarray], length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D int arrays into a right-padded (B, L) int64 tensor and (B,) int64 lengths.

    L is ``length`` or the longest row. Rows longer than L raise ValueError.
    """
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
    width = int(lengths.max()) if length is None and len(rows) else (length or 0)
    if len(rows) and int(lengths.max()) > width:
        raise ValueError(f"a row of {int(lengths.max())} items does not fit the padded length {width}")
    out = torch.zeros((len(rows), width), dtype=torch.int64)
    for b, row in enumerate(rows):
        out[b, : len(row)] = torch.from_numpy(np.asarray(row, dtype=np.int64))
    return out, lengths


class NextItemWindows(Dataset):
    """Training samples: windows of up to ``max_len + 1`` events of each history.

    Item i of a sample is the input at position t and the target at position t - 1 (SASRec's
    all-positions next-item objective). Histories shorter than 2 events yield nothing.

    ``windows="last"``: one sample per user, the last ``max_len + 1`` events (SASRec's recipe;
    older events of longer histories are never trained on). ``windows="all"``: the whole history,
    cut from the end into windows of ``max_len + 1`` events that overlap by one, so every event
    after a user's first is a target exactly once; a history of n events gives
    ``ceil((n - 1) / max_len)`` samples.

    ``gaps``: optional time-gap buckets with the offsets of ``histories``
    (``recsys_alibi.data.time_gaps``); each sample is then a (2, n) array, items over gaps.

    Raises:
        ValueError: ``windows`` is neither "last" nor "all"; ``gaps`` not aligned with ``histories``.
    """

    def __init__(
        self, histories: FlatSequences, max_len: int, windows: str = "last", gaps: FlatSequences | None = None
    ) -> None:
        if windows not in ("last", "all"):
            raise ValueError(f"windows must be 'last' or 'all', got {windows!r}")
        check_aligned(histories, gaps)
        self.histories = histories
        self.gaps = gaps
        self.max_len = max_len
        lengths = histories.lengths()
        users = np.flatnonzero(lengths >= 2)
        per_user = -(-(lengths[users] - 1) // max_len) if windows == "all" else np.ones(users.size, np.int64)
        self.users = np.repeat(users, per_user)  # (S,) user row of each sample
        first = np.repeat(np.cumsum(per_user) - per_user, per_user)
        back = np.arange(self.users.size) - first  # 0 = the last window, 1 = the one before, ...
        self.ends = histories.offsets[self.users + 1] - back * max_len  # (S,) exclusive end in values
        self.starts = np.maximum(histories.offsets[self.users], self.ends - max_len - 1)

    def __len__(self) -> int:
        return len(self.users)

    def __getitem__(self, i: int) -> np.ndarray:
        window = slice(self.starts[i], self.ends[i])
        items = self.histories.values[window]
        return items if self.gaps is None else np.stack([items, self.gaps.values[window]])


def check_aligned(histories: FlatSequences, gaps: FlatSequences | None) -> None:
    """ValueError unless ``gaps`` is None or holds one value per event of ``histories`` (same offsets)."""
    if gaps is not None and not np.array_equal(gaps.offsets, histories.offsets):
        raise ValueError("time gaps must have exactly the offsets of the histories (one bucket per event)")


def _split_gaps(samples: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """Samples of (n,) items or (2, n) items over gaps -> (item rows, gap rows or None)."""
    if not samples or np.ndim(samples[0]) == 1:
        return samples, None
    return [s[0] for s in samples], [s[1] for s in samples]


def target_positions(targets: torch.Tensor) -> torch.Tensor:
    """(T,) int64 flat indices into ``targets.reshape(-1)`` of the positions with a target (> 0).

    Made by the collate functions on the host, so that the training step gathers the T
    supervised positions with an index of known size instead of a boolean selection (which
    would make the host wait for the GPU to learn T).
    """
    return torch.nonzero(targets.reshape(-1) > 0).squeeze(1)


def collate_next_item(samples: list[np.ndarray]) -> dict[str, torch.Tensor]:
    """Windows -> ``inputs`` (B, L) int64, ``targets`` (B, L) int64 (0 = no target), ``lengths`` (B,),
    ``target_positions`` (T,) int64 (:func:`target_positions`), and with time gaps ``gaps`` (B, L)
    int64: the buckets of the inputs (0 at padding)."""
    items, gap_rows = _split_gaps(samples)
    tokens, lengths = pad_right(items)  # (B, L + 1)
    valid = torch.arange(tokens.shape[1] - 1)[None, :] < (lengths - 1)[:, None]  # (B, L)
    inputs = tokens[:, :-1] * valid  # each row's last event is only a target
    targets = tokens[:, 1:]
    batch = {
        "inputs": inputs, "targets": targets, "lengths": lengths - 1, "target_positions": target_positions(targets)
    }  # fmt: skip
    if gap_rows is not None:
        batch["gaps"] = pad_right(gap_rows)[0][:, :-1] * valid
    return batch


def collate_packed_next_item(samples: list[np.ndarray], row_len: int) -> dict[str, torch.Tensor]:
    """Windows packed several to a row of ``row_len`` positions (no padding compute).

    Returns ``inputs`` / ``targets`` (R, row_len) int64 (0 = padding / no target), ``seq_ids``
    (R, row_len) int64 (s + 1 for sample s, 0 = padding), ``lengths`` (R,) filled positions and
    ``target_positions`` (T,) int64 (:func:`target_positions`).
    R <= B rows; a sample's outputs do not depend on what it shares a row with (ALiBi needs only
    distances, so no position offsets). With time gaps also ``gaps`` (R, row_len) int64, packed
    like the inputs. Packing: ``recsys_alibi.model.packing``.
    """
    from recsys_alibi.model.packing import pack_items, pack_sequences

    items, gap_rows = _split_gaps(samples)
    inputs = [torch.from_numpy(np.asarray(w[:-1], dtype=np.int64)) for w in items]
    targets = [torch.from_numpy(np.asarray(w[1:], dtype=np.int64)) for w in items]
    plan = pack_sequences([len(t) for t in inputs], row_len)
    packed = pack_items(inputs, row_len, plan=plan)
    packed_targets = pack_items(targets, row_len, plan=plan).tokens
    batch = {
        "inputs": packed.tokens,
        "targets": packed_targets,
        "seq_ids": packed.seq_ids,
        "lengths": (packed.seq_ids > 0).sum(1),
        "target_positions": target_positions(packed_targets),
    }
    if gap_rows is not None:
        gap_inputs = [torch.from_numpy(np.asarray(g[:-1], dtype=np.int64)) for g in gap_rows]
        batch["gaps"] = pack_items(gap_inputs, row_len, plan=plan).tokens
    return batch


class HistoryTargets(Dataset):
    """Validation samples: (last ``max_len`` events of a history, its held-out target item, the
    whole history). ``gaps`` (aligned time-gap buckets): the window is a (2, n) array, items
    over gaps. The whole history is the seen set masked under ``exclude_seen``: the model reads
    only the window, but every earlier item is seen (the seen-item rule of
    ``recsys_alibi.evaluation.ranking``, as ``evaluate`` applies it)."""

    def __init__(
        self, histories: FlatSequences, targets: np.ndarray, max_len: int | None, gaps: FlatSequences | None = None
    ) -> None:
        check_aligned(histories, gaps)
        keep = histories.lengths() >= 1
        self.histories = histories
        self.gaps = gaps
        self.rows = np.flatnonzero(keep)
        self.targets = np.asarray(targets, dtype=np.int64)
        self.max_len = max_len

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int, np.ndarray]:
        u = int(self.rows[i])
        seen = self.histories.get(u)
        history = seen if self.max_len is None else seen[-self.max_len :]
        if self.gaps is not None:
            history = np.stack([history, self.gaps.get(u, last=self.max_len)])
        return history, int(self.targets[u]), seen


def collate_history_targets(samples: list[tuple[np.ndarray, int, np.ndarray]]) -> dict[str, torch.Tensor]:
    """-> ``history`` (B, L) int64 right-padded model input, ``lengths`` (B,), ``targets`` (B,)
    int64, ``seen`` (B, S) int64 the whole histories right-padded (S >= L), and with time gaps
    ``history_gaps`` (B, L) int64."""
    items, gap_rows = _split_gaps([s[0] for s in samples])
    history, lengths = pad_right(items)
    seen = pad_right([s[2] for s in samples])[0] if any(len(s[2]) > len(h) for s, h in zip(samples, items)) else history
    batch = {"history": history, "lengths": lengths, "targets": torch.tensor([s[1] for s in samples]), "seen": seen}
    if gap_rows is not None:
        batch["history_gaps"] = pad_right(gap_rows)[0]
    return batch
