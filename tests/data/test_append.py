"""``prepare --append`` equals a full prepare of every input together, up to the numbering of new items."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from recsys_alibi.config import DataConfig
from recsys_alibi.data.append import append
from recsys_alibi.data.ingest import DataError
from recsys_alibi.data.prepare import prepare, read_items, read_sequences
from tests.data.kill_fixtures import run_killed

COMPARED: list[int] = []  # batches of each example the property test compared


# ----------------------------------------------------------------------------- logs in batches


@st.composite
def batched_logs(draw, line_order: bool = False):
    """(batches of CSV lines, k-core thresholds): 2-5 batches in time order, with late events,
    an event delivered again in a later batch, new users and items, rejected lines, and
    sometimes an id spelled ``07`` in a late batch (which makes the whole column text)."""
    n = draw(st.integers(20, 70))
    users = draw(st.integers(3, 12))
    items = draw(st.integers(3, 10))
    events = [
        (draw(st.integers(0, users - 1)), draw(st.integers(0, items - 1)), draw(st.integers(0, 60)), draw(st.sampled_from(["a", "b"])))
        for _ in range(n)
    ]
    events.sort(key=lambda e: e[2])  # time order
    k = draw(st.integers(2, 5))
    cuts = sorted(draw(st.lists(st.integers(1, n - 1), min_size=k - 1, max_size=k - 1, unique=True)))
    batches = [events[a:b] for a, b in zip([0, *cuts], [*cuts, n])]
    for _ in range(draw(st.integers(0, 4))):  # late: an event moved to a later batch; again: copied to one
        src = draw(st.integers(0, k - 2))
        if batches[src]:
            event = batches[src][draw(st.integers(0, len(batches[src]) - 1))]
            dst = draw(st.integers(src + 1, k - 1))
            if draw(st.booleans()):
                batches[src].remove(event)
            batches[dst].insert(draw(st.integers(0, len(batches[dst]))), event)
    lines = [[_line(e, line_order) for e in batch] for batch in batches]
    for b in range(1, k):  # a new user and a new item, rare enough to sit on the k-core edge
        if draw(st.booleans()):
            lines[b].append(_line((users + b, items + b, 70 + b, "a"), line_order))
    for _ in range(draw(st.integers(0, 3))):  # rejected lines
        lines[draw(st.integers(0, k - 1))].append("9" if line_order else "5,,x,a")
    if not line_order and draw(st.integers(0, 4)) == 0:
        lines[k - 1].append("07,1,65,a")  # not an integer as Int64 prints it: user_id becomes String
    thresholds = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    return lines, thresholds


def _line(event: tuple, line_order: bool) -> str:
    user, item, t, kind = event
    return f"{user} {item}" if line_order else f"{user},{item},{t},{kind}"


def _write_batches(folder: Path, lines: list[list[str]], line_order: bool) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    header = "" if line_order else "user_id,item_id,timestamp,event_type\n"
    paths = []
    for b, batch in enumerate(lines, start=1):
        path = folder / (f"day{b}.txt" if line_order else f"day{b}.csv")
        path.write_text(header + "".join(line + "\n" for line in batch))
        paths.append(path)
    return paths


def _cfg(thresholds: tuple[int, int], line_order: bool) -> DataConfig:
    extra = {"format": "sasrec"} if line_order else {"columns": {"event_type": "event_type"}}
    return DataConfig(min_events_per_user=thresholds[0], min_events_per_item=thresholds[1], **extra)


def _by_raw_ids(directory: Path) -> dict:
    """Everything a prepared directory holds, with items named by raw id (item_idx mapped away)."""
    items = read_items(directory)
    names = dict(zip(items["item_idx"].to_list(), items["item_id"].to_list()))
    sequences = read_sequences(directory).sort("user_id")
    stats = json.loads((directory / "stats.json").read_text())
    rejects = pl.read_parquet(directory / "rejects.parquet") if (directory / "rejects.parquet").exists() else None
    return {
        "sequences": [
            (user, [names[i] for i in idx], ts)
            for user, idx, ts in zip(sequences["user_id"], sequences["item_idx"].to_list(), sequences["timestamp"].to_list())
        ],
        "items": items.select("item_id", "count").sort("item_id"),
        "events": pl.read_parquet(directory / "events.parquet").sort(pl.all()),
        "rejects": rejects,
        "counts": {k: stats[k] for k in ("input_rows", "rejected", "deduplicated", "filtered_min_value", "filtered_kcore", "kept", "users", "items")},
        "rejects_by_reason": stats["rejects_by_reason"],
        "times": (stats["timestamp_min"], stats["timestamp_max"]),
    }


def _assert_same(appended: dict, full: dict) -> None:
    assert appended["counts"] == full["counts"]
    assert appended["sequences"] == full["sequences"]
    assert_frame_equal(appended["items"], full["items"])
    assert_frame_equal(appended["events"], full["events"])
    assert appended["rejects_by_reason"] == full["rejects_by_reason"] and appended["times"] == full["times"]
    if full["rejects"] is None:
        assert appended["rejects"] is None
    else:
        assert_frame_equal(appended["rejects"], full["rejects"])


def _append_step_by_step(cfg: DataConfig, paths: list[Path], out: Path) -> bool:
    """prepare the first batch, append the others one at a time; every existing item_idx kept.

    Returns False when the first batch alone cannot be prepared (empty, nothing left after the k-core).
    """
    try:
        prepare(cfg, paths[0], out)
    except DataError:
        return False
    for path in paths[1:]:
        before = read_items(out)
        result = append(cfg, path, out)
        after = read_items(out)
        assert result.appended
        old = before.select("item_idx", pl.col("item_id").cast(after["item_id"].dtype))
        assert_frame_equal(after.head(before.height).select("item_idx", "item_id"), old)  # same index, same id
        assert after["item_idx"].to_list() == list(range(1, after.height + 1))  # new ones after every existing one
    return True


@pytest.mark.parametrize("line_order", [False, True], ids=["csv", "sasrec"])
def test_append_in_batches_equals_a_full_prepare_of_all_inputs(tmp_path_factory, line_order):
    @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(batched_logs(line_order=line_order))
    def check(log):
        lines, thresholds = log
        tmp = tmp_path_factory.mktemp("log")
        paths = _write_batches(tmp / "in", lines, line_order)
        cfg = _cfg(thresholds, line_order)
        try:
            prepare(cfg, tmp / "in", tmp / "full")
        except DataError:  # nothing left after the k-core even for the union: nor for its first batch
            assert not _append_step_by_step(cfg, paths, tmp / "app")
            return
        if not _append_step_by_step(cfg, paths, tmp / "app"):
            return  # the first batch alone is empty or has nothing left after the k-core
        _assert_same(_by_raw_ids(tmp / "app"), _by_raw_ids(tmp / "full"))
        COMPARED.append(len(paths))

    COMPARED.clear()
    check()
    assert len(COMPARED) >= 3 and max(COMPARED) >= 3  # examples compared, some with 3+ batches


def _events(path: Path, rows: list[tuple]) -> Path:
    path.write_text("user_id,item_id,timestamp\n" + "".join(f"{u},{i},{t}\n" for u, i, t in rows))
    return path


def test_events_dropped_by_the_k_core_come_back_when_a_later_batch_lifts_them(tmp_path):
    cfg = DataConfig(min_events_per_user=2, min_events_per_item=2)
    day1 = _events(tmp_path / "day1.csv", [("a", "x", 1), ("a", "y", 2), ("b", "x", 3), ("b", "y", 4), ("c", "z", 5)])
    out = tmp_path / "p"
    prepare(cfg, day1, out)
    assert read_items(out)["item_id"].to_list() == ["x", "y"]  # c and z are below the thresholds
    day2 = _events(tmp_path / "day2.csv", [("c", "x", 6), ("a", "z", 0), ("a", "y", 2)])  # late, and a repeat
    result = append(cfg, day2, out)
    items = read_items(out)
    assert items.rows() == [(1, "x", 3), (2, "y", 2), (3, "z", 2)]  # x, y keep 1, 2; z comes back as 3
    sequences = {row["user_id"]: row for row in read_sequences(out).iter_rows(named=True)}
    assert sequences["a"]["item_idx"] == [3, 1, 2] and sequences["a"]["timestamp"] == [0, 1, 2]  # the late event first
    assert sequences["c"]["item_idx"] == [3, 1] and sequences["c"]["timestamp"] == [5, 6]  # back from day 1
    assert result.counts["deduplicated"] == 1 and result.stats["appended"] == {
        "input_rows": 3, "new_users": 1, "new_items": 1, "new_events": 3,
    }  # fmt: skip


def test_the_same_append_again_changes_nothing(tmp_path):
    cfg = DataConfig(min_events_per_user=1, min_events_per_item=1)
    out = tmp_path / "p"
    prepare(cfg, _events(tmp_path / "day1.csv", [("a", "x", 1), ("b", "y", 2)]), out)
    new = tmp_path / "new"
    new.mkdir()
    _events(new / "day2.csv", [("a", "y", 3), ("c", "z", 4)])
    append(cfg, new, out)
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    again = append(cfg, new, out)
    assert not again.appended and again.counts["events"] == 4
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files  # not one byte rewritten
    _events(new / "day3.csv", [("c", "x", 5)])  # a folder that grows: only the new file is read
    third = append(cfg, new, out)
    assert third.stats["appended"]["input_rows"] == 1 and third.counts["input_rows"] == 5


def test_an_append_with_other_settings_or_without_a_prepared_dir_is_one_line(tmp_path):
    cfg = DataConfig(min_events_per_user=1, min_events_per_item=1)
    out = tmp_path / "p"
    prepare(cfg, _events(tmp_path / "day1.csv", [("a", "x", 1)]), out)
    day2 = _events(tmp_path / "day2.csv", [("a", "y", 3)])
    cases = [
        (cfg.model_copy(update={"min_events_per_item": 2}), day2, out, "min_events_per_item 1, this input has 2"),
        (cfg.model_copy(update={"format": "ndjson"}), tmp_path / "day2.ndjson", out, "format 'csv', this input has 'ndjson'"),
        (cfg, tmp_path / "other.csv", out, "raw_columns"),
        (cfg, tmp_path / "swapped.csv", out, "raw_columns"),  # the same columns in another order
        (cfg, day2, tmp_path / "missing", "is not a prepared directory"),
    ]
    (tmp_path / "day2.ndjson").write_text('{"user_id": "a", "item_id": "y", "timestamp": 3}\n')
    (tmp_path / "other.csv").write_text("user_id,item_id,timestamp,extra\na,y,3,1\n")
    (tmp_path / "swapped.csv").write_text("item_id,user_id,timestamp\ny,a,3\n")
    for config, path, target, expected in cases:
        with pytest.raises(DataError) as err:
            append(config, path, target)
        assert expected in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "missing").exists()
    assert read_items(out)["item_id"].to_list() == ["x"]  # untouched


def test_cli_prepare_append_end_to_end(tmp_path, capsys, caplog):
    from pipelines.cli import main

    loose = ["--set", "data.min_events_per_user=1", "--set", "data.min_events_per_item=1"]
    day1 = _events(tmp_path / "day1.csv", [("a", "x", 1), ("b", "y", 2)])
    day2 = _events(tmp_path / "day2.csv", [("a", "z", 3), ("c", "x", 4), ("a", "z", 3)])
    out = tmp_path / "prepared"
    assert main(["prepare", "--input", str(day1), "--output", str(out), *loose]) == 0
    assert main(["prepare", "--input", str(day2), "--output", str(out), "--append", *loose]) == 0
    assert ("appended 3 rows: the prepared data gained 2 events, 1 users and 1 items (with any of earlier inputs that "
            "the k-core now keeps)") in capsys.readouterr().out
    assert read_items(out).rows() == [(1, "x", 2), (2, "y", 1), (3, "z", 1)]
    caplog.clear()
    assert main(["prepare", "--input", str(day2), "--output", str(out), "--append", *loose]) == 0
    out_text, err_text = capsys.readouterr()
    assert out_text.count("nothing to append") == 1  # said once, by the summary: not logged on stderr as well
    assert "nothing to append" not in err_text and not [r for r in caplog.records if "nothing to append" in r.getMessage()]
    # a user the k-core cut on day 1 (one event, two needed) comes back with one more: 1 row, 2 events gained
    two = ["--set", "data.min_events_per_user=2", "--set", "data.min_events_per_item=1"]
    day1 = _events(tmp_path / "k1.csv", [("a", "x", 1), ("b", "y", 2), ("b", "x", 3)])
    assert main(["prepare", "--input", str(day1), "--output", str(tmp_path / "k"), *two]) == 0
    assert main(["prepare", "--input", str(_events(tmp_path / "k2.csv", [("a", "y", 4)])), "--output",
                 str(tmp_path / "k"), "--append", *two]) == 0  # fmt: skip
    assert "appended 1 rows: the prepared data gained 2 events, 1 users and 0 items" in capsys.readouterr().out
    assert main(["prepare", "--input", str(day2), "--output", str(tmp_path / "none"), "--append", *loose]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot append to") and "\n" not in err


# ----------------------------------------------------------------------------- killed appends

@pytest.mark.parametrize(
    ("target", "when"),
    [("manifest.json", "before"), ("sequences.parquet", "after")],
    ids=["before-publishing", "while-publishing"],
)
def test_a_killed_append_reruns_to_the_uninterrupted_result(tmp_path, target, when):
    cfg = DataConfig(min_events_per_user=2, min_events_per_item=2)
    day1 = _events(tmp_path / "day1.csv", [(u, i, 10 * u + i) for u in range(6) for i in range(3)])
    day2 = _events(tmp_path / "day2.csv", [(u, i, 10 * u + i + 5) for u in range(3, 9) for i in range(2, 5)])
    calm, killed = tmp_path / "calm", tmp_path / "killed"
    prepare(cfg, day1, calm)
    prepare(cfg, day1, killed)
    before = _by_raw_ids(killed)
    run_killed(tmp_path, day2, killed, target, when, append=True, k=2)
    if when == "before":  # nothing published: the old directory, whole, for every reader
        _assert_same(_by_raw_ids(killed), before)
    else:  # killed between two renames: readers refuse (one line) until the next prepare or append
        with pytest.raises(DataError, match="half-written"):
            read_sequences(killed)
    append(cfg, day2, calm)
    append(cfg, day2, killed)  # finishes (or redoes) the killed append; never appends it twice
    assert not [n for n in os.listdir(killed) if n.startswith(".")]
    _assert_same(_by_raw_ids(killed), _by_raw_ids(calm))
    assert_frame_equal(read_items(killed), read_items(calm))


@pytest.mark.parametrize("killed", ["append", "prepare"])
def test_the_half_written_message_names_the_fix_that_loses_no_appended_day(tmp_path, killed):
    """Issue 41, defect 2: readers said "run `recsys-alibi prepare` again"; doing that with the day's file
    replaced the whole appended history with that day. The message names re-running with --append,
    which finishes the publish (roll forward) and adds nothing twice, for a killed append as for a
    killed full prepare; following it gives the uninterrupted result."""
    from pipelines.cli import main

    cfg = DataConfig(min_events_per_user=2, min_events_per_item=2)
    day1 = _events(tmp_path / "day1.csv", [(u, i, 10 * u + i) for u in range(6) for i in range(3)])
    day2 = _events(tmp_path / "day2.csv", [(u, i, 10 * u + i + 5) for u in range(3, 9) for i in range(2, 5)])
    day3 = _events(tmp_path / "day3.csv", [(u, i, 10 * u + i + 9) for u in range(5, 10) for i in range(4, 7)])
    calm, out = tmp_path / "calm", tmp_path / "out"
    for directory in (calm, out):
        prepare(cfg, day1, directory)
        append(cfg, day2, directory)
    if killed == "append":  # the daily job killed while publishing day 3
        run_killed(tmp_path, day3, out, "sequences.parquet", "after", append=True, k=2)
        append(cfg, day3, calm)
    else:  # a full prepare of day 3 alone, killed while publishing: its own result is what it wanted
        run_killed(tmp_path, day3, out, "sequences.parquet", "after", k=2, overwrite=True)
        prepare(cfg.model_copy(update={"overwrite": True}), day3, calm)
    with pytest.raises(DataError) as err:
        read_sequences(out)
    message = str(err.value)
    assert message == (f"{out} is half-written (a `recsys-alibi prepare` was killed while replacing its files); "
                       "run the interrupted command again, with --append if it had none (same --input, --output and "
                       "--config): it finishes the publish without losing anything and adds no file twice; without "
                       "--append a prepare replaces the whole directory, appended days included, with its --input "
                       "alone")  # fmt: skip
    sets = ["--set", "data.min_events_per_user=2", "--set", "data.min_events_per_item=2"]
    assert main(["prepare", "--input", str(day3), "--output", str(out), "--append", *sets]) == 0  # as the message says
    _assert_same(_by_raw_ids(out), _by_raw_ids(calm))
    assert_frame_equal(read_items(out), read_items(calm))


def test_append_sorts_and_deduplicates_at_full_precision_across_batches(tmp_path):
    cfg = DataConfig(min_events_per_user=1, min_events_per_item=1, timestamp_unit="ms")
    folder = tmp_path / "in"
    folder.mkdir()
    day1 = _events(folder / "day1.csv", [("a", "x", 1_000_500), ("a", "y", 1_000_900)])
    day2 = _events(folder / "day2.csv", [("a", "z", 1_000_700), ("a", "x", 1_000_500), ("a", "y", 1_000_901)])
    prepare(cfg, folder, tmp_path / "full")
    prepare(cfg, day1, tmp_path / "app")
    result = append(cfg, day2, tmp_path / "app")
    got = _by_raw_ids(tmp_path / "app")
    # one second, ordered by the milliseconds; the x delivered twice is one event, y 1 ms later is not
    assert got["sequences"] == [("a", ["x", "z", "y", "y"], [1000, 1000, 1000, 1000])]
    assert result.counts["deduplicated"] == 1
    _assert_same(got, _by_raw_ids(tmp_path / "full"))


@pytest.mark.parametrize("spelling", ["7", "07"])
def test_integer_ids_stay_int64_only_while_every_input_round_trips(tmp_path, spelling):
    cfg = DataConfig(min_events_per_user=1, min_events_per_item=1)
    folder = tmp_path / "in"
    folder.mkdir()
    day1 = _events(folder / "day1.csv", [(1, 10, 1), (2, 10, 2), (7, 11, 3)])
    day2 = _events(folder / "day2.csv", [(spelling, 11, 4), (3, 12, 5)])
    prepare(cfg, folder, tmp_path / "full")
    prepare(cfg, day1, tmp_path / "app")
    assert read_sequences(tmp_path / "app").schema["user_id"] == pl.Int64
    append(cfg, day2, tmp_path / "app")
    users = read_sequences(tmp_path / "app")["user_id"]
    # "07" is not 7: the whole column becomes text, as in a full prepare, and 7 / 07 stay two users
    assert users.dtype == (pl.Int64 if spelling == "7" else pl.String)
    assert users.len() == (4 if spelling == "7" else 5)
    _assert_same(_by_raw_ids(tmp_path / "app"), _by_raw_ids(tmp_path / "full"))


def _render(fmt: str, rows: list[tuple], path: Path) -> Path:
    """Events ``(user, item, time)`` (None: a field left out, a reject) written in ``fmt``."""
    if fmt == "parquet":
        pl.DataFrame(rows, schema={"user_id": pl.Int64, "item_id": pl.Int64, "timestamp": pl.Int64}, orient="row").write_parquet(path)
    elif fmt == "ndjson":
        path.write_text("".join(json.dumps({"user_id": u, "item_id": i, "timestamp": t}) + "\n" for u, i, t in rows))
    elif fmt == "movielens":
        path.write_text("".join(f"{u}::{'' if i is None else i}::5::{t}\n" for u, i, t in rows))
    else:  # s3rec: one line per user, items in time order
        users = dict.fromkeys(u for u, _, _ in rows)
        path.write_text("".join(f"{u} " + " ".join(str(i) for v, i, _ in rows if v == u and i is not None) + "\n" for u in users))
    return path


@pytest.mark.parametrize(("fmt", "suffix"), [("parquet", "parquet"), ("ndjson", "ndjson"), ("movielens", "dat"), ("s3rec", "txt")])
def test_append_equals_a_full_prepare_for_every_format(tmp_path, fmt, suffix):
    cfg = DataConfig(min_events_per_user=2, min_events_per_item=2, format=fmt)
    day1 = [(1, 10, 5), (1, 11, 6), (2, 10, 7), (2, 11, 8), (3, 13, 9)]  # user 3 and item 13 below the 2-core
    day2 = [(3, 10, 10), (1, 13, 4), (2, 10, 7), (4, 13, 11), (4, 11, 12)]  # lifts them; late, repeated, new user
    if fmt not in ("parquet", "s3rec"):
        day2.append((5, None, 13))  # a reject
    folder = tmp_path / "in"
    folder.mkdir()
    _render(fmt, day1, folder / f"day1.{suffix}")
    _render(fmt, day2, folder / f"day2.{suffix}")
    prepare(cfg, folder, tmp_path / "full")
    prepare(cfg, folder / f"day1.{suffix}", tmp_path / "app")
    append(cfg, folder / f"day2.{suffix}", tmp_path / "app")
    appended, full = _by_raw_ids(tmp_path / "app"), _by_raw_ids(tmp_path / "full")
    _assert_same(appended, full)
    assert appended["counts"]["users"] == 4 and appended["counts"]["kept"] == (10 if fmt == "s3rec" else 9)  # s3rec: a repeated line is a re-consumption


def test_an_append_without_a_format_reads_the_new_files_as_the_directory_was_read(tmp_path):
    sasrec = DataConfig(min_events_per_user=1, min_events_per_item=1, format="sasrec")
    out = tmp_path / "p"
    (tmp_path / "day1.txt").write_text("1 10\n1 11\n2 10\n")
    (tmp_path / "day2.txt").write_text("1 12 13\n")  # three fields: would be inferred as s3rec
    prepare(sasrec, tmp_path / "day1.txt", out)
    with pytest.raises(DataError, match="bad_field_count|format"):
        append(sasrec.model_copy(update={"format": "s3rec"}), tmp_path / "day2.txt", out)
    result = append(DataConfig(min_events_per_user=1, min_events_per_item=1), tmp_path / "day2.txt", out)
    assert result.stats["format"] == "sasrec" and result.counts["rejected"] == 1  # a sasrec line with 3 fields


def test_a_day_without_events_appends_nothing_and_is_no_error(tmp_path):
    cfg = DataConfig(min_events_per_user=1, min_events_per_item=1, format="sasrec")
    out = tmp_path / "p"
    (tmp_path / "day1.txt").write_text("1 10\n1 11\n")
    (tmp_path / "day2.txt").write_text("")  # a quiet day
    prepare(cfg, tmp_path / "day1.txt", out)
    result = append(cfg, tmp_path / "day2.txt", out)
    assert result.appended and result.stats["appended"] == {"input_rows": 0, "new_users": 0, "new_items": 0, "new_events": 0}
    assert read_sequences(out)["item_idx"].to_list() == [[1, 2]]
    assert not append(cfg, tmp_path / "day2.txt", out).appended  # recorded: a re-run changes nothing


def test_parquet_days_with_columns_in_another_order_or_null_typed_and_empty_append_as_a_full_prepare(tmp_path):
    """Parquet columns are found by name, and an empty frame written by pandas or Polars has Null columns: such days
    append (they were refused as other raw_columns, and an empty day's Null types replaced the directory's, so the
    next normal day was refused) and give what a full prepare of every day gives. A CSV header in another order, or
    another type in a day with rows, is still refused (the first test of raw_columns above, and the last case here)."""
    cfg = DataConfig(min_events_per_user=2, min_events_per_item=2)
    days = tmp_path / "days"
    days.mkdir()
    pl.DataFrame({"user_id": [1, 1, 2, 2], "item_id": [7, 11, 7, 11], "timestamp": [100, 200, 150, 250]}).write_parquet(days / "day1.parquet")
    pl.DataFrame({"user_id": [], "item_id": [], "timestamp": []}).write_parquet(days / "day2.parquet")  # Null columns
    pl.DataFrame({"item_id": [7, 11], "timestamp": [5, 6], "user_id": [3, 3]}).write_parquet(days / "day3.parquet")
    pl.DataFrame({"user_id": [4, 4], "item_id": [7, 11], "timestamp": [7, 8]}).write_parquet(days / "day4.parquet")
    out = tmp_path / "appended"
    prepare(cfg, days / "day1.parquet", out)
    for day in ("day2", "day3", "day4"):
        assert append(cfg, days / f"{day}.parquet", out).appended
    prepare(cfg, days, tmp_path / "full")
    _assert_same(_by_raw_ids(out), _by_raw_ids(tmp_path / "full"))
    assert read_sequences(out).sort("user_id")["timestamp"].to_list() == [[100, 200], [150, 250], [5, 6], [7, 8]]
    pl.DataFrame({"user_id": [5], "item_id": ["7"], "timestamp": [9]}).write_parquet(tmp_path / "text.parquet")
    with pytest.raises(DataError, match="raw_columns"):
        append(cfg, tmp_path / "text.parquet", out)
