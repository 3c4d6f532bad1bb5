"""Issue 41, defects 13 and 15: every reader of a user-given path says what a FIFO (or socket, or
device) is and why it is refused, and every user-given folder skips hidden and ``_`` names."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import polars as pl
import pytest

from pipelines.cli import main
from recsys_alibi.config import load_config
from recsys_alibi.data.formats import resolve_paths
from recsys_alibi.data.ingest import DataError
from recsys_alibi.data.item_table import read_item_table

FIFO_WHY = ("is a FIFO (named pipe), not a regular file or directory: a pipe can be read only once, and an input "
            "is read more than once (its format is sniffed, then it is read in passes): write it to a file first")  # fmt: skip


def _events(path: Path) -> Path:
    path.write_text("user_id,item_id,timestamp\n1,10,1\n1,11,2\n2,10,3\n")
    return path


def test_a_fifo_given_as_input_is_named_as_a_fifo_never_as_missing(tmp_path, capsys):
    os.mkfifo(tmp_path / "events.csv")  # nobody writes: a reader that opened it would wait forever
    assert main(["prepare", "--input", str(tmp_path / "events.csv"), "--output", str(tmp_path / "prep")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: input '{tmp_path / 'events.csv'}' {FIFO_WHY} (--input)"
    assert not (tmp_path / "prep").exists()


def test_a_fifo_inside_an_input_folder_or_matched_by_a_glob_is_refused_not_skipped(tmp_path):
    folder = tmp_path / "days"
    folder.mkdir()
    _events(folder / "day1.csv")
    os.mkfifo(folder / "day2.csv")
    for given in (folder, folder / "day*.csv"):
        with pytest.raises(DataError) as err:
            resolve_paths(given)
        assert str(err.value) == f"input '{folder / 'day2.csv'}' {FIFO_WHY} (--input)"
    os.mkfifo(folder / ".day3.csv")  # hidden: skipped by the folder rule, as every hidden name
    (folder / "day2.csv").unlink()
    assert resolve_paths(folder) == [folder / "day1.csv"]


def test_missing_inputs_and_dangling_links_are_said_so(tmp_path):
    os.symlink(tmp_path / "gone.csv", tmp_path / "link.csv")
    with pytest.raises(DataError) as err:
        resolve_paths(tmp_path / "link.csv")
    assert str(err.value) == (f"input not found: '{tmp_path / 'link.csv'}' (a symbolic link to the missing "
                              f"{tmp_path / 'gone.csv'}); pass an existing file, directory or glob as --input")  # fmt: skip


def test_a_fifo_as_prepared_dir_or_item_table_is_named(tmp_path, capsys):
    os.mkfifo(tmp_path / "prep")
    assert main(["evaluate", "--prepared", str(tmp_path / "prep"), "--baseline", "popularity",
                 "--output", str(tmp_path / "report")]) == 2  # fmt: skip
    assert capsys.readouterr().err.strip() == (
        f"error: {tmp_path / 'prep'} is a FIFO (named pipe), not a prepared directory; give the directory "
        "`recsys-alibi prepare` wrote"
    )
    os.mkfifo(tmp_path / "items.csv")
    with pytest.raises(DataError, match=r"item table '.*items.csv' is a FIFO \(named pipe\), not a regular file"):
        read_item_table(tmp_path / "items.csv")


def test_a_config_from_a_pipe_is_read_once(tmp_path):
    """``--config <(envsubst < job.yaml)``: a pipe is read once, like a file (was 'config file not found')."""
    os.mkfifo(tmp_path / "job.yaml")

    def write() -> None:
        with open(tmp_path / "job.yaml", "w") as pipe:
            pipe.write("seed: 7\nmodel:\n  n_layers: 3\n")

    threading.Thread(target=write, daemon=True).start()
    config = load_config(tmp_path / "job.yaml")
    assert (config.seed, config.model.n_layers) == (7, 3)


def test_a_spark_rule_folder_reads_its_part_files_only(tmp_path):
    """Spark on a local disk writes part files beside hidden .crc checksums and _SUCCESS."""
    from serving.rules import RuleFile

    folder = tmp_path / "deny"
    folder.mkdir()
    pl.DataFrame({"item_id": [1001, 1002]}).write_parquet(folder / "part-00000.parquet")
    pl.DataFrame({"item_id": [1003]}).write_parquet(folder / "part-00001.parquet")
    (folder / ".part-00000.parquet.crc").write_bytes(b"crc\x00\x01")
    (folder / "_SUCCESS").write_bytes(b"")
    rule = RuleFile.open("deny", str(folder))
    assert sorted(rule.scan().collect().get_column("item_id").to_list()) == [1001, 1002, 1003]
    os.mkfifo(folder / "part-00002.parquet")
    with pytest.raises(DataError, match=r"score.deny rule file '.*part-00002.parquet' is a FIFO"):
        RuleFile.open("deny", str(folder))


def test_an_existing_path_with_glob_characters_is_taken_literally(tmp_path):
    d = tmp_path / "gl"
    d.mkdir()
    (d / "we[1].csv").write_text("user_id,item_id,timestamp\nA,x,1\nA,y,2\n")
    (d / "we1.csv").write_text("user_id,item_id,timestamp\nB,z,1\n")  # what the name matches as a glob
    for name in ("we[1].csv", "we[1].ndjson", "we[1].parquet", "s*t.csv"):
        path = d / name
        if name.endswith(".ndjson"):
            path.write_text('{"user_id":"A","item_id":"x","timestamp":1}\n{"user_id":"A","item_id":"y","timestamp":2}\n')
        elif name.endswith(".parquet"):
            pl.DataFrame({"user_id": ["A", "A"], "item_id": ["x", "y"], "timestamp": [1, 2]}).write_parquet(path)
        elif name != "we[1].csv":
            path.write_text((d / "we[1].csv").read_text())
        assert resolve_paths(path) == [path]
        assert main(["prepare", "--input", str(path), "--output", str(tmp_path / "out"), "--set", "data.overwrite=true",
                     "--set", "data.min_events_per_user=1", "--set", "data.min_events_per_item=1"]) == 0
        events = pl.read_parquet(tmp_path / "out" / "events.parquet")
        assert events.select("user_id", "item_id").rows() == [("A", "x"), ("A", "y")], name
    assert resolve_paths(d / "we[0-9].csv") == [d / "we1.csv"]  # nothing of that name: a glob
    with pytest.raises(DataError, match="no file is named '.*x\\[1\\].csv' and no files match it as a glob pattern"):
        resolve_paths(d / "x[1].csv")
    (d / "we1.csv").unlink()
    assert read_item_table(d / "we[1].parquet").frame.height == 2
