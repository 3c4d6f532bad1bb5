"""What an input's bytes can do to the readers: a byte-order mark, files that are not text by their first
bytes, 64-bit unsigned ids, values beyond float32, column names the readers use themselves, a column mapped
twice; and an append of a file that grew in place. Each case was a silent wrong result or a traceback."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recsys_alibi.config import ColumnMap, DataConfig
from recsys_alibi.data.append import append
from recsys_alibi.data.errors import DataError
from recsys_alibi.data.ingest import canonical_events, scan_source
from recsys_alibi.data.prepare import prepare
from tests.data.test_data_ingest import TEXT_FORMAT_CASES

LOOSE = DataConfig(min_events_per_user=1, min_events_per_item=1)
BOM = b"\xef\xbb\xbf"


def _error(cfg: DataConfig, path, out, fmt=None) -> str:
    with pytest.raises(DataError) as info:
        prepare(cfg, path, out, fmt=fmt)
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize(("name", "text", "fmt"), [case for case in TEXT_FORMAT_CASES if case[2] not in ("csv", "ndjson")])
@pytest.mark.parametrize("gz", [False, True])
def test_a_byte_order_mark_is_no_part_of_the_first_user(tmp_path, name, text, fmt, gz):
    # a Windows editor's BOM was read into user 1's id: '\ufeff1', another user, and the column turned String
    data = BOM + text.encode()
    path = tmp_path / (name + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(data) if gz else data)
    source = scan_source(LOOSE, path)  # inferred, too: the BOM does not hide the format
    assert source.fmt == fmt
    events = canonical_events(source, LOOSE).collect().sort("source_row")
    assert events["user_id"].dtype == pl.Int64
    assert events["user_id"].to_list() == [1, 1, 2] and events["item_id"].to_list() == [10, 11, 10]


def test_a_value_beyond_float32_is_a_bad_value_not_inf(tmp_path):
    path = tmp_path / "v.csv"
    path.write_text("user_id,item_id,timestamp,rating\n1,10,100,1e40\n1,11,101,-1e300\n1,12,102,4.5\n")
    cfg = DataConfig(columns=ColumnMap(value="rating"), min_events_per_user=1, min_events_per_item=1)
    prepare(cfg, path, tmp_path / "out")
    rejects = pl.read_parquet(tmp_path / "out" / "rejects.parquet").sort("source_row")
    assert rejects.select("rating", "reject_reason").rows() == [("1e40", "bad_value"), ("-1e300", "bad_value")]
    assert pl.read_parquet(tmp_path / "out" / "events.parquet")["value"].to_list() == [4.5]


def test_uint64_ids_above_int64_are_kept_as_text_and_small_ones_as_integers(tmp_path):
    # 64-bit hashed ids: about half are >= 2^63; they were rejected as bad_item_id (exit 0, half the data gone)
    big = [2**64 - 1, 2**63, 17]
    table = {"user_id": pa.array([1, 1, 2], pa.int64()), "timestamp": pa.array([100, 200, 150], pa.int64())}
    pq.write_table(pa.table({**table, "item_id": pa.array(big, pa.uint64())}), tmp_path / "big.parquet")
    pq.write_table(pa.table({**table, "item_id": pa.array([5, 6, 5], pa.uint64())}), tmp_path / "small.parquet")
    result = prepare(LOOSE, tmp_path / "big.parquet", tmp_path / "out_big")
    items = pl.read_parquet(tmp_path / "out_big" / "items.parquet")
    assert result.counts["rejected"] == 0 and items["item_id"].dtype == pl.String
    assert sorted(items["item_id"].to_list()) == sorted(str(i) for i in big)
    prepare(LOOSE, tmp_path / "small.parquet", tmp_path / "out_small")
    small = pl.read_parquet(tmp_path / "out_small" / "items.parquet")
    assert small["item_id"].dtype == pl.Int64 and sorted(small["item_id"].to_list()) == [5, 6]


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_a_fixed_rejects_file_can_be_prepared_back(tmp_path, suffix):
    # a rejects file carries source_row and reject_reason: both collided with the readers' own columns
    def write(frame: pl.DataFrame, name: str):
        path = tmp_path / f"{name}.{suffix}"
        frame.write_csv(path) if suffix == "csv" else frame.write_parquet(path)
        return path

    day = write(pl.DataFrame({"user_id": [1, 1, 2], "item_id": [10, None, 10], "timestamp": [100, 200, 150]}), "day")
    prepare(LOOSE, day, tmp_path / "out")
    rejects = pl.read_parquet(tmp_path / "out" / "rejects.parquet")
    assert rejects.columns == ["user_id", "item_id", "timestamp", "source_row", "reject_reason"]
    fixed = rejects.with_columns(pl.lit(11).cast(rejects["item_id"].dtype).alias("item_id"))
    path = write(fixed.with_columns(pl.lit(3).alias("_fields"), pl.lit(4).alias("_c_user_id")), "fixed")
    result = append(LOOSE, path, tmp_path / "out")
    assert result.counts["events"] == 3 and result.counts["rejected"] == 1  # the earlier reject stays on record
    assert sorted(pl.read_parquet(tmp_path / "out" / "events.parquet")["item_id"].to_list()) == [10, 10, 11]


def test_a_mapped_column_named_like_the_readers_own_is_refused(tmp_path):
    path = tmp_path / "e.csv"
    path.write_text("source_row,item_id,timestamp\n1,10,100\n")
    cfg = DataConfig(columns=ColumnMap(user_id="source_row"), min_events_per_user=1, min_events_per_item=1)
    assert _error(cfg, path, tmp_path / "out").startswith(
        "column 'source_row' (data.columns.user_id) has a name the reader gives a column of its own")


def test_one_column_mapped_twice_is_refused(tmp_path):
    path = tmp_path / "e.csv"
    path.write_text("user_id,item_id,timestamp\n1,10,100\n")
    cfg = DataConfig(columns=ColumnMap(user_id="item_id"), min_events_per_user=1, min_events_per_item=1)
    assert _error(cfg, path, tmp_path / "out") == (
        "data.columns.user_id and data.columns.item_id both name the column 'item_id'; map each to a column of its own")


def test_files_that_are_not_text_by_their_first_bytes_are_named_so(tmp_path):
    text = b"user_id,item_id,timestamp\n1,10,100\n1,11,200\n"
    pl.DataFrame({"user_id": [1], "item_id": [10], "timestamp": [100]}).write_parquet(tmp_path / "p.csv")
    assert _error(LOOSE, tmp_path / "p.csv", tmp_path / "o") == (
        f"'{tmp_path / 'p.csv'}' is a Parquet file (it starts with PAR1), not text: read it as Parquet "
        "(--format parquet, or a name ending in .parquet)")
    (tmp_path / "z.csv").write_bytes(gzip.compress(text))
    assert _error(LOOSE, tmp_path / "z.csv", tmp_path / "o").startswith(
        f"'{tmp_path / 'z.csv'}' is gzip-compressed but its name does not end in .gz: rename it to 'z.csv.gz'")
    (tmp_path / "twice.csv.gz").write_bytes(gzip.compress(gzip.compress(text)))
    assert _error(LOOSE, tmp_path / "twice.csv.gz", tmp_path / "o").startswith(
        f"'{tmp_path / 'twice.csv.gz'}' was gzip-compressed twice: decompress it once more")
    (tmp_path / "u16.csv").write_bytes(text.decode().encode("utf-16"))
    message = _error(LOOSE, tmp_path / "u16.csv", tmp_path / "o")
    assert "is UTF-16 text (it starts with a UTF-16 byte-order mark), not UTF-8" in message
    assert "iconv -f utf-16 -t utf-8" in message
    (tmp_path / "le.csv").write_bytes(text.decode().encode("utf-16-le"))  # no byte-order mark: was a column error
    assert _error(LOOSE, tmp_path / "le.csv", tmp_path / "o") == (
        f"'{tmp_path / 'le.csv'}' looks like UTF-16LE text without a byte-order mark (every other byte is 0), not "
        f"UTF-8: convert it, e.g. iconv -f utf-16le -t utf-8 '{tmp_path / 'le.csv'}' > 'le.utf8.csv'")
    (tmp_path / "be.dat.gz").write_bytes(gzip.compress("1::10::5::100\n".encode("utf-16-be")))
    assert "looks like UTF-16BE text without a byte-order mark" in _error(LOOSE, tmp_path / "be.dat.gz", tmp_path / "o")


def test_an_ndjson_file_of_blank_lines_is_an_empty_input(tmp_path):
    (tmp_path / "e.ndjson").write_text("\n\n")
    assert _error(LOOSE, tmp_path / "e.ndjson", tmp_path / "o") == (
        f"empty input: '{tmp_path / 'e.ndjson'}' has no JSON object with a field; point --input at the event log")


def test_an_append_of_a_file_that_grew_in_place_is_refused(tmp_path):
    # SASRec lines are never duplicates: a re-read grown file repeated every history (exit 0)
    logs = tmp_path / "in"
    logs.mkdir()
    lines = [f"{u} {i}\n" for u in (1, 2) for i in range(10, 16)]
    (logs / "today.txt").write_text("".join(lines[:6]))
    prepare(LOOSE, logs, tmp_path / "out")
    before = (tmp_path / "out" / "sequences.parquet").read_bytes()
    (logs / "today.txt").write_text("".join(lines))
    with pytest.raises(DataError, match=r"cannot append '.*today.txt': it grew since it was prepared into .* \(its "
                                        r"first 30 bytes are the file prepared then\)"):  # fmt: skip
        append(LOOSE, logs, tmp_path / "out")
    assert (tmp_path / "out" / "sequences.parquet").read_bytes() == before
    (logs / "today.txt").write_text("".join(lines[6:]))  # the day's export written over yesterday's: a new input
    assert append(LOOSE, logs, tmp_path / "out").counts["events"] == 12
    state = json.loads((tmp_path / "out" / "stats.json").read_text())["append_state"]
    assert [(f["path"], f["bytes"]) for f in state["input_files"]] == [(str((logs / "today.txt").resolve()), 30)] * 2
