"""The prepared directory changes as a whole: killed prepares, mixed files, pinned readers, leftovers."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

from recsys_alibi.config import DataConfig, ModelConfig, TrainConfig
from recsys_alibi.data.ingest import DataError
from recsys_alibi.data.partition import read_lengths, read_sequence_rows
from recsys_alibi.data.prepare import prepare, read_items, read_sequences
from recsys_alibi.data.prepared import PREPARE_AGAIN, data_sha256, prepare_lock
from recsys_alibi.data.time_gaps import check_time_protocol, has_real_timestamps
from recsys_alibi.training.datamodule import SequenceDataModule
from serving.inputs import open_input
from tests.data.kill_fixtures import run_killed

LOOSE = DataConfig(min_events_per_user=1, min_events_per_item=1)
OVER = LOOSE.model_copy(update={"overwrite": True})  # another log over a prepared directory: replaced on purpose


def _events(path: Path, users: int, items: list[str]) -> Path:
    rows = [f"u{u},{items[(u + t) % len(items)]},{100 * u + t}" for u in range(users) for t in range(4)]
    path.write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    return path


def _killed_prepare(tmp_path: Path, events: Path, out: Path, target: str, when: str) -> None:
    run_killed(tmp_path, events, out, target, when, overwrite=True)


def _readers(out: Path, tmp_path: Path) -> list:
    items = pl.DataFrame({"item_idx": [1], "item_id": ["x"]}, schema={"item_idx": pl.Int32, "item_id": pl.String})
    return [
        lambda: read_sequences(out),
        lambda: read_items(out),
        lambda: read_lengths(out),
        lambda: read_sequence_rows(out, [0], ["user_id", "item_idx"]),
        lambda: has_real_timestamps(out),
        lambda: SequenceDataModule(out, ModelConfig(max_len=4), TrainConfig(), seed=0),
        lambda: open_input(out, items, LOOSE, tmp_path / "staged"),  # what `score --input DIR` opens
    ]


def test_a_prepare_killed_while_replacing_files_leaves_a_dir_every_reader_refuses(tmp_path):
    out = tmp_path / "prepared"
    prepare(LOOSE, _events(tmp_path / "old.csv", 6, ["a", "b", "c"]), out)
    new = _events(tmp_path / "new.csv", 9, ["p", "q", "r", "s", "t"])  # another catalog and other users
    _killed_prepare(tmp_path, new, out, "sequences.parquet", "after")  # new sequences beside the old vocabulary
    for read in _readers(out, tmp_path):
        with pytest.raises(DataError, match="half-written|mixed") as err:
            read()
        assert "\n" not in str(err.value) and "recsys-alibi prepare" in str(err.value)
    from pipelines.cli import main

    assert main(["train", "--prepared", str(out), "--set", "model.max_len=4"]) == 2
    # the next prepare cleans what the killed one left and publishes a whole directory
    prepare(OVER, new, out)
    assert not [n for n in os.listdir(out) if n.startswith(".")]
    assert read_items(out).get_column("item_id").sort().to_list() == ["p", "q", "r", "s", "t"]
    assert read_sequences(out).height == 9


def test_a_prepare_killed_before_publishing_keeps_the_old_dir_whole_and_its_leftovers_are_removed(tmp_path):
    out = tmp_path / "prepared"
    prepare(LOOSE, _events(tmp_path / "old.csv", 6, ["a", "b", "c"]), out)
    new = _events(tmp_path / "new.csv", 9, ["p", "q", "r", "s", "t"])
    _killed_prepare(tmp_path, new, out, "manifest.json", "before")  # everything staged, nothing published
    leftovers = [n for n in os.listdir(out) if n.startswith(".")]
    assert any(n.startswith(".prepare-") for n in leftovers) and any(n.endswith(".tmp") for n in leftovers)
    assert read_items(out).get_column("item_id").to_list() == ["a", "b", "c"]  # the old data, consistent
    assert read_sequences(out).height == 6
    prepare(OVER, new, out)
    assert not [n for n in os.listdir(out) if n.startswith(".")]
    assert read_sequences(out).height == 9


def test_readers_pinned_to_one_prepare_refuse_the_directory_prepared_again(tmp_path):
    out = tmp_path / "prepared"
    prepare(LOOSE, _events(tmp_path / "a.csv", 6, ["a", "b", "c"]), out)
    datamodule = SequenceDataModule(out, ModelConfig(max_len=4), TrainConfig(), seed=0)  # reads lengths, items
    prepare(OVER, _events(tmp_path / "b.csv", 9, ["p", "q", "r"]), out)
    with pytest.raises(DataError, match="prepared again while"):
        datamodule.load()  # what each training process reads later (its users' rows)
    with pytest.raises(DataError, match="prepared again while"):
        read_items(out, datamodule.prepare_id)


def test_a_file_swapped_in_from_another_prepare_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    prepare(LOOSE, _events(tmp_path / "a.csv", 6, ["a", "b", "c"]), a)
    prepare(LOOSE, _events(tmp_path / "b.csv", 6, ["a", "b", "c"]), b)
    os.replace(b / "items.parquet", a / "items.parquet")  # same schema, same size: only the id tells
    with pytest.raises(DataError, match="mixed: items.parquet"):
        read_items(a)
    assert read_sequences(a).height == 6  # the files that do belong are still read


def test_a_directory_without_manifest_is_read_as_it_is(tmp_path):
    out = tmp_path / "prepared"
    prepare(LOOSE, _events(tmp_path / "a.csv", 6, ["a", "b", "c"]), out)
    (out / "manifest.json").unlink()  # e.g. a directory built by hand or by an older version
    assert read_sequences(out).height == 6 and read_items(out).height == 3


def test_data_fingerprint_is_the_same_for_the_same_events_in_any_directory(tmp_path):
    events = _events(tmp_path / "a.csv", 6, ["a", "b", "c"])
    prepare(LOOSE, events, tmp_path / "one")
    prepare(LOOSE, events, tmp_path / "two")
    assert data_sha256(tmp_path / "one") == data_sha256(tmp_path / "two")
    (tmp_path / "one" / "manifest.json").unlink()  # computed again from the files: the same value
    assert data_sha256(tmp_path / "one") == data_sha256(tmp_path / "two")
    prepare(LOOSE, _events(tmp_path / "b.csv", 6, ["a", "b", "d"]), tmp_path / "three")  # one item renamed
    assert data_sha256(tmp_path / "three") != data_sha256(tmp_path / "two")


def test_a_second_prepare_into_a_directory_being_prepared_is_refused(tmp_path):
    out = tmp_path / "prepared"
    events = _events(tmp_path / "a.csv", 6, ["a", "b", "c"])
    with prepare_lock(out):
        with pytest.raises(DataError, match="another `recsys-alibi prepare` is writing"):
            prepare(LOOSE, events, out)
    assert prepare(LOOSE, events, out).counts["users"] == 6  # the lock is released with the block


@pytest.mark.parametrize("name", ["sequences.parquet", "items.parquet", "stats.json"])
def test_a_truncated_prepared_file_is_reported_unreadable_by_every_reader(tmp_path, name):
    out = tmp_path / "prepared"
    prepare(LOOSE, _events(tmp_path / "a.csv", 6, ["a", "b", "c"]), out)
    path = out / name
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # e.g. a copy cut short by a full disk
    readers = _readers(out, tmp_path)
    if name == "items.parquet":  # the readers that read the vocabulary
        readers = [readers[1], readers[5], readers[6]]
    elif name == "stats.json":  # where time came from: time gaps, the temporal protocol
        readers = [readers[4], lambda: check_time_protocol(out, "temporal")]
    else:
        readers = [r for i, r in enumerate(readers) if i not in (1, 4)]  # not the vocabulary, not stats.json
    for read in readers:
        with pytest.raises(DataError) as err:
            read()
        assert str(err.value).startswith(f"cannot read {path}: ") and "mixed" not in str(err.value), err.value
        assert str(err.value).endswith(PREPARE_AGAIN) and "\n" not in str(err.value)


def test_data_fingerprint_depends_on_the_events_not_on_the_partitioning(tmp_path):
    events = _events(tmp_path / "a.csv", 400, [f"i{k}" for k in range(30)])  # 1600 events
    prepare(LOOSE, events, tmp_path / "one")
    prepare(LOOSE.model_copy(update={"partition_rows": 1000}), events, tmp_path / "two")  # 2 user-hash partitions
    one, two = (pl.read_parquet(tmp_path / d / "sequences.parquet") for d in ("one", "two"))
    assert not one.equals(two) and one.sort("user_id").equals(two.sort("user_id"))  # other row order, same rows
    assert data_sha256(tmp_path / "one") == data_sha256(tmp_path / "two")
    for d in ("one", "two"):
        (tmp_path / d / "manifest.json").unlink()  # computed again from the files: the same value
    assert data_sha256(tmp_path / "one") == data_sha256(tmp_path / "two")
    other = tmp_path / "b.csv"
    other.write_text(events.read_text().replace("u7,", "u7x,", 1))  # one event of another user
    prepare(LOOSE, other, tmp_path / "three")
    assert data_sha256(tmp_path / "three") != data_sha256(tmp_path / "two")


def test_a_prepare_over_a_directory_of_other_inputs_is_refused_not_a_silent_loss(tmp_path):
    # a daily job that forgot --append once replaced every earlier day with the one file it read (exit 0)
    from recsys_alibi.data.append import append

    day1, day2 = _events(tmp_path / "day1.csv", 3, ["a", "b"]), _events(tmp_path / "day2.csv", 4, ["c", "d"])
    out = tmp_path / "prepared"
    prepare(LOOSE, day1, out)
    assert prepare(LOOSE, day1, out).counts["events"] == 12  # the same prepare again: replaced, nothing lost
    append(LOOSE, day2, out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(DataError) as info:
        prepare(LOOSE, day2, out)
    assert str(info.value) == (
        f"{out} holds the events of 1 input file(s) that this prepare does not read (e.g. '{day1.resolve()}', prepared "
        "earlier or added with --append): a prepare replaces the directory as a whole, so they would be lost; add this "
        "input with --append (data.append=true), prepare every input together, or --set data.overwrite=true to replace "
        "it")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    both = tmp_path / "both"
    both.mkdir()
    for day in (day1, day2):
        (both / day.name).write_bytes(day.read_bytes())
    assert prepare(LOOSE, both, out).counts["events"] == 28  # every input together (moved: by their bytes): allowed
    (both / "day1.csv").write_text((both / "day1.csv").read_text().replace("u0,", "u9,"))  # corrected in place
    assert prepare(LOOSE, both, out).counts["users"] == 5  # read again at its path (u0 of day 1 now u9): allowed
    assert prepare(OVER, day2, out).counts["events"] == 16
