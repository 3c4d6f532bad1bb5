"""``train.warm.replay``: warm epochs over the users who changed since the parent, plus a replayed sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recsys_alibi.config import DataConfig, ModelConfig, TrainConfig
from recsys_alibi.data.buckets import LengthBuckets
from recsys_alibi.data.prepare import prepare, read_items
from recsys_alibi.training.datamodule import SequenceDataModule
from recsys_alibi.training.recent_epochs import MappedBatches, SubsetShuffle, epoch_users

RECENT = np.array([True, False, False, True, False, False, False])  # users 0 and 3 changed; 5 older


def test_every_recent_user_plus_the_replayed_share_of_older_ones():
    for epoch in range(5):
        users = epoch_users(RECENT, 1.0, seed=7, epoch=epoch)
        assert users.size == 4 and {0, 3} <= set(users.tolist()) and np.all(np.diff(users) > 0)
        assert set(users.tolist()) - {0, 3} <= {1, 2, 4, 5, 6}
    assert epoch_users(RECENT, 0.0, seed=7, epoch=0).tolist() == [0, 3]
    assert epoch_users(RECENT, 0.5, seed=7, epoch=0).size == 3  # round(0.5 * 2) = 1 older user
    assert epoch_users(RECENT, 10.0, seed=7, epoch=0).tolist() == list(range(7))  # at most every older user
    assert epoch_users(np.zeros(3, bool), 1.0, seed=7, epoch=0).tolist() == []  # nothing new: an empty epoch
    with pytest.raises(ValueError, match="replay must be >= 0"):
        epoch_users(RECENT, -1.0, seed=7, epoch=0)


def test_the_draw_depends_on_seed_and_epoch_only():
    """A resumed run draws the same users for an epoch as the uninterrupted run; epochs differ."""
    same = [epoch_users(RECENT, 1.0, seed=7, epoch=3).tolist() for _ in range(3)]
    assert same[0] == same[1] == same[2]
    draws = {tuple(epoch_users(RECENT, 1.0, seed=7, epoch=e).tolist()) for e in range(20)}
    assert len(draws) > 1  # a fresh sample of older users every epoch
    expected = np.sort(np.r_[[0, 3], np.random.default_rng([7, 3, 1]).choice([1, 2, 4, 5, 6], size=2, replace=False)])
    assert same[0] == expected.tolist()


def test_samplers_keep_to_the_subset():
    indices = np.array([2, 5, 9, 11])
    shuffle = SubsetShuffle(indices, seed=1)
    shuffle.set_epoch(4)
    order = list(shuffle)
    assert sorted(order) == [2, 5, 9, 11] and len(shuffle) == 4
    assert order == indices[np.random.default_rng([1, 4]).permutation(4)].tolist()
    batches = LengthBuckets(np.array([3, 3, 3, 3]), batch_tokens=6, max_rows=2, seed=0)
    mapped = MappedBatches(batches, indices)
    assert len(mapped) == len(batches) == 2
    assert sorted(i for batch in mapped for i in batch) == [2, 5, 9, 11]


@pytest.fixture
def prepared(tmp_path) -> Path:
    """u0-u3 have an event after time 100 (the parent's last), u4 and u5 do not; 5 events each."""
    last = {"u0": 150, "u1": 90, "u2": 101, "u3": 300, "u4": 100, "u5": 50}
    rows = [f"{u},{'abcdefgh'[(k + i) % 8]},{t - 4 + i}" for k, (u, t) in enumerate(last.items()) for i in range(5)]
    (tmp_path / "e.csv").write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    prepare(DataConfig(min_events_per_user=1, min_events_per_item=1), tmp_path / "e.csv", tmp_path / "prepared")
    return tmp_path / "prepared"


@pytest.mark.parametrize("batch_tokens", [None, 12])
def test_a_focused_epoch_trains_the_recent_users_and_the_replayed_ones(prepared, batch_tokens):
    import polars as pl

    from recsys_alibi.data.loader import NextItemWindows

    dm = SequenceDataModule(prepared, ModelConfig(max_len=8), TrainConfig(batch_size=2, batch_tokens=batch_tokens), seed=3)
    dm.focus_recent(after=100, replay=0.0)
    dm.load()
    users = pl.read_parquet(prepared / "sequences.parquet").get_column("user_id").to_list()
    assert [users[i] for i in np.flatnonzero(dm.train_recent)] == ["u0", "u2", "u3"]
    dataset = NextItemWindows(dm.train_histories, 8)
    assert sorted(dataset.users[dm.epoch_samples(dataset)].tolist()) == np.flatnonzero(dm.train_recent).tolist()
    dm.focus_recent(after=100, replay=1.0)  # 3 recent users and all 3 older ones
    dm.load()
    assert dm.epoch_samples(dataset).tolist() == list(range(6))
    loader = dm.train_loader(8)
    batches = list(loader.batch_sampler) if batch_tokens else [list(loader.sampler)]
    assert sorted(i for batch in batches for i in batch) == list(range(6))


def test_without_replay_every_user_trains_every_epoch(prepared):
    dm = SequenceDataModule(prepared, ModelConfig(max_len=8), TrainConfig(batch_size=2), seed=3)
    dm.load()
    assert dm.train_recent is None and dm.recent_after is None
    loader = dm.train_loader(8)
    assert sorted(loader.sampler) == list(range(6))


def test_replay_with_several_processes_is_refused(prepared):
    from recsys_alibi.config import ConfigError

    dm = SequenceDataModule(prepared, ModelConfig(max_len=8), TrainConfig(batch_size=2), seed=3)
    dm.focus_recent(after=100, replay=1.0)
    with pytest.raises(ConfigError, match="train.warm.replay trains on a different subset of users on each process"):
        dm.load(0, 2)
