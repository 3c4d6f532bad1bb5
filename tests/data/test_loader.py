"""Flat (Arrow-layout) sequences and the right-padded batches built from them."""

import numpy as np
import polars as pl
import torch

from recsys_alibi.data.loader import (
    FlatSequences,
    HistoryTargets,
    NextItemWindows,
    collate_history_targets,
    collate_next_item,
    pad_right,
)


def _flat() -> FlatSequences:
    return FlatSequences.from_series(pl.Series("h", [[1, 2, 3, 4], [5], [6, 7]], dtype=pl.List(pl.Int32)))


def test_flat_sequences_follow_arrow_offsets_even_for_a_slice():
    series = pl.Series("h", [[9], [1, 2, 3, 4], [5], [6, 7]], dtype=pl.List(pl.Int32)).slice(1, 3)
    flat = FlatSequences.from_series(series)
    assert flat.lengths().tolist() == [4, 1, 2]
    assert flat.get(0).tolist() == [1, 2, 3, 4]
    assert flat.get(0, last=2).tolist() == [3, 4]
    assert flat.get(2).tolist() == [6, 7]


def test_pad_right_and_too_long_rows():
    tokens, lengths = pad_right([np.array([1, 2]), np.array([3])])
    assert tokens.tolist() == [[1, 2], [3, 0]] and lengths.tolist() == [2, 1]
    try:
        pad_right([np.array([1, 2, 3])], length=2)
    except ValueError:
        pass
    else:
        raise AssertionError("a row longer than the padded length must raise")


def test_next_item_windows_shift_by_one_and_skip_single_events():
    dataset = NextItemWindows(_flat(), max_len=2)
    assert len(dataset) == 2  # the 1-event user is left out
    batch = collate_next_item([dataset[0], dataset[1]])
    # user 0: last 3 events 2,3,4 -> inputs 2,3 targets 3,4; user 2: 6,7 -> inputs 6 targets 7
    assert batch["inputs"].tolist() == [[2, 3], [6, 0]]
    assert batch["targets"].tolist() == [[3, 4], [7, 0]]
    assert batch["lengths"].tolist() == [2, 1]


def test_all_windows_cover_every_target_once_and_overlap_by_one_event():
    flat = FlatSequences.from_series(pl.Series("h", [[1, 2, 3, 4, 5, 6], [7], [8, 9]], dtype=pl.List(pl.Int32)))
    dataset = NextItemWindows(flat, max_len=2, windows="all")
    windows = [dataset[i].tolist() for i in range(len(dataset))]
    # user 0 (6 events, ceil(5 / 2) = 3 windows, newest first), user 1 skipped, user 2 one window
    assert windows == [[4, 5, 6], [2, 3, 4], [1, 2], [8, 9]]
    targets = sorted(t for w in windows for t in w[1:])
    assert targets == [2, 3, 4, 5, 6, 9]  # every event after a user's first, exactly once
    assert [w.tolist() for w in (NextItemWindows(flat, max_len=2)[i] for i in range(2))] == [[4, 5, 6], [8, 9]]


def test_windows_must_be_last_or_all():
    import pytest

    with pytest.raises(ValueError, match="'last' or 'all'"):
        NextItemWindows(_flat(), max_len=2, windows="every")


def test_history_targets_truncate_to_last_events():
    dataset = HistoryTargets(_flat(), np.array([10, 11, 12]), max_len=3)
    batch = collate_history_targets([dataset[i] for i in range(len(dataset))])
    assert batch["history"].tolist() == [[2, 3, 4], [5, 0, 0], [6, 7, 0]]
    assert batch["targets"].tolist() == [10, 11, 12]
    assert torch.equal(batch["lengths"], torch.tensor([3, 1, 2]))


def test_packed_batches_hold_the_same_pairs_as_padded_ones():
    from recsys_alibi.data.loader import collate_packed_next_item

    windows = [np.array([1, 2, 3, 4]), np.array([6, 7]), np.array([8, 9, 5])]
    packed = collate_packed_next_item(windows, row_len=4)
    assert packed["inputs"].shape[0] == 2  # 3 + 1 + 2 input positions fit in two rows of 4
    pairs = {
        (int(i), int(t), int(s))
        for i, t, s in zip(packed["inputs"].flatten(), packed["targets"].flatten(), packed["seq_ids"].flatten())
        if s > 0
    }
    ids = {}
    for i, t, s in pairs:
        ids.setdefault(s, []).append((i, t))
    assert sorted(sorted(v) for v in ids.values()) == [[(1, 2), (2, 3), (3, 4)], [(6, 7)], [(8, 9), (9, 5)]]
    assert packed["lengths"].tolist() == (packed["seq_ids"] > 0).sum(1).tolist()
    padded = collate_next_item(windows)
    assert int((padded["targets"] > 0).sum()) == int((packed["targets"] > 0).sum()) == 6
