"""``generate --days``: the synthetic log as time-ordered daily files with users and items arriving."""

from __future__ import annotations

import polars as pl

from pipelines.cli import main
from recsys_alibi.config import GenerateConfig
from recsys_alibi.data.synthetic import LATE_ITEM_SHARE, generate_events, split_days

CFG = GenerateConfig(users=120, items=60, min_events=10, max_events=80)


def test_days_are_time_ordered_slices_of_the_log_with_late_items_dropped_before_release():
    log = generate_events(CFG, seed=4)
    days = split_days(log, 4, CFG.items, seed=4)
    assert len(days) == 4 and all(day.columns == log.columns for day in days)
    for before, after in zip(days, days[1:]):  # periods follow each other in time
        assert before.get_column("timestamp").max() < after.get_column("timestamp").min()
    union = pl.concat(days)
    assert union.height < log.height  # events of items before their release are gone
    assert union.join(log, on=log.columns, how="anti").height == 0  # nothing else: every kept row is a log row
    # every event the days hold is the log's, and an item's kept events are the log's events from some time on
    dropped = log.join(union, on=log.columns, how="anti")
    late = set(dropped.get_column("item_id").to_list())
    assert len(late) <= round(LATE_ITEM_SHARE * CFG.items)
    for item in late:
        gone = dropped.filter(pl.col("item_id") == item).get_column("timestamp")
        kept = union.filter(pl.col("item_id") == item).get_column("timestamp")
        assert kept.len() == 0 or gone.max() < kept.min(), item
    first_day_items = set(days[0].get_column("item_id").to_list())
    assert late.isdisjoint(first_day_items)  # released after day 1
    later_items = set(union.get_column("item_id").to_list()) - first_day_items
    later_users = set(union.get_column("user_id").to_list()) - set(days[0].get_column("user_id").to_list())
    assert later_items and later_users  # new items and new users arrive on later days
    assert split_days(log, 1, CFG.items, seed=4)[0].equals(log)  # one day: the whole log


def test_generate_days_command_writes_and_replaces_daily_files(tmp_path, capsys):
    out = tmp_path / "days"
    base = ["generate", "--users", "120", "--items", "60", "--set", "generate.min_events=10",
            "--set", "generate.max_events=80", "--output", str(out)]  # fmt: skip
    assert main([*base, "--days", "3"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert sorted(p.name for p in out.iterdir()) == ["day-001.parquet", "day-002.parquet", "day-003.parquet"]
    days = [pl.read_parquet(out / f"day-00{d}.parquet") for d in (1, 2, 3)]
    expected = split_days(generate_events(CFG, seed=42), 3, 60, seed=42)
    assert all(a.equals(b) for a, b in zip(days, expected))
    assert printed[0] == f"generated {sum(d.height for d in days)} events as 3 daily files -> {out}"
    users = set(days[0].get_column("user_id").to_list())
    new = len(set(days[1].get_column("user_id").to_list()) - users)
    assert printed[2].startswith(f"  day-002.parquet: {days[1].height} events, {new} new users, ")
    assert main([*base, "--days", "2"]) == 0  # fewer days: the third file of the earlier run goes
    assert sorted(p.name for p in out.iterdir()) == ["day-001.parquet", "day-002.parquet"]
    assert main([*base, "--days", "0"]) == 2
    assert "generate.days" in capsys.readouterr().err
