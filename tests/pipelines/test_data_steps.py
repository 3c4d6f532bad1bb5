"""``generate``: the events file is replaced atomically and a killed run's temporary file is removed."""

from __future__ import annotations

import os

import polars as pl

from pipelines.data_steps import run_generate
from recsys_alibi.config import load_config
from recsys_alibi.staging import held_temp, release


def test_generate_removes_the_temporary_file_a_killed_generate_left(tmp_path):
    output = tmp_path / "events.parquet"
    killed, fd = held_temp(output)  # a killed run's leftover: its lock released
    killed.write_bytes(b"PAR1 half a file")
    release(fd)
    (tmp_path / ".other.parquet.x.tmp").write_bytes(b"not ours")
    other, fd = held_temp(tmp_path / "events.parquet.v2")  # another output's (killed too): not this one's
    release(fd)
    config = load_config(None, ["generate.users=5", "generate.items=10", "generate.max_events=30"])
    result = run_generate(config, output)
    assert sorted(os.listdir(tmp_path)) == sorted([".other.parquet.x.tmp", other.name, "events.parquet"])
    assert pl.read_parquet(output).height == result.events


def test_generate_never_writes_its_item_table_over_a_file_it_did_not_write(tmp_path):
    # a user's catalog at items.parquet beside the events was replaced by the synthetic table, exit 0
    import pytest

    from recsys_alibi.data.errors import DataError

    config = load_config(None, ["generate.users=5", "generate.items=10", "generate.max_events=30", "generate.item_table=true"])
    catalog = tmp_path / "items.parquet"
    pl.DataFrame({"item_id": [1, 2], "title": ["a", "b"]}).write_parquet(catalog)
    before = catalog.read_bytes()
    with pytest.raises(DataError, match=r"'.*items.parquet' exists and generate did not write it"):
        run_generate(config, tmp_path / "events.parquet")
    assert catalog.read_bytes() == before and not (tmp_path / "events.parquet").exists()
    catalog.unlink()
    first = run_generate(config, tmp_path / "events.parquet")  # its own table it writes again
    assert run_generate(config, tmp_path / "events.parquet").item_table == first.item_table == catalog


def test_generate_days_never_replaces_or_removes_a_day_file_it_did_not_write(tmp_path):
    # a user's day-007.parquet was removed as "left by an earlier run", and day-001.parquet overwritten
    import pytest

    from pipelines.data_steps import run_generate_days
    from recsys_alibi.data.errors import DataError

    config = load_config(None, ["generate.users=8", "generate.items=10", "generate.max_events=30", "generate.days=3"])
    (tmp_path / "_items").mkdir()
    mine = tmp_path / "_items" / "day-009.parquet"
    pl.DataFrame({"item_id": [1]}).write_parquet(mine)
    before = mine.read_bytes()
    with pytest.raises(DataError, match=r"'.*_items/day-009.parquet' exists and generate did not write it"):
        run_generate_days(config, tmp_path)
    assert mine.read_bytes() == before and not list(tmp_path.glob("day-*.parquet"))
    mine.unlink()
    first = run_generate_days(config, tmp_path)
    two = load_config(None, ["generate.users=8", "generate.items=10", "generate.max_events=30", "generate.days=2"])
    assert run_generate_days(two, tmp_path).files == first.files[:2]  # its own third day: removed
    assert sorted(p.name for p in tmp_path.glob("day-*.parquet")) == ["day-001.parquet", "day-002.parquet"]
