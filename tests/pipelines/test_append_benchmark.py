"""benchmarks/append.py at small sizes: its default users and items follow --events, a log too sparse for the
5-core is one line, and its cached logs are keyed by every setting that makes them."""

from __future__ import annotations

import polars as pl
import pytest
from benchmark_scripts import load_benchmark

bench = load_benchmark("append", "append_benchmark")


def test_small_events_run_with_the_default_users_and_items(tmp_path, capsys):
    bench.main(["--events", "20000", "--new", "500", "--formats", "parquet", "--workdir", str(tmp_path)])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| parquet |")]
    assert len(rows) == 1 and rows[0].startswith("| parquet | 20,000 | 500 |")
    assert (tmp_path / "log-20000-500-400-200-parquet").is_dir()  # 20,000 / 50 users, 20,000 / 100 items


def test_a_log_too_sparse_for_the_5_core_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--events", "2000", "--new", "100", "--users", "100000", "--items", "50000", "--formats", "parquet",
                    "--workdir", str(tmp_path)])  # fmt: skip
    line = str(exit_.value.code)
    assert line.startswith("error: 1,900 earlier events over 100,000 users and 50,000 items are too sparse") and (
        "\n" not in line and "give fewer --users/--items" in line)


def test_the_cached_log_follows_users_and_items(tmp_path):
    first = bench.write_inputs(2000, 100, 50, 40, tmp_path)["parquet"][0]
    again = bench.write_inputs(2000, 100, 50, 40, tmp_path)["parquet"][0]
    other = bench.write_inputs(2000, 100, 500, 400, tmp_path)["parquet"][0]
    assert again == first and other != first
    assert pl.read_parquet(first)["user_id"].max() < 50 and pl.read_parquet(first)["item_id"].max() < 40
    assert pl.read_parquet(other)["user_id"].max() >= 50 and pl.read_parquet(other)["item_id"].max() >= 40
