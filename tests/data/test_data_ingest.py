"""Readers, format inference, canonical columns and reject reasons, on tiny hand-built files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

from recsys_alibi.config import ColumnMap, DataConfig
from recsys_alibi.data.ingest import DataError, canonical_events, infer_format, resolve_paths, scan_source
from recsys_alibi.data.prepare import prepare
from recsys_alibi.data.schema import SUBSECOND

LOOSE = DataConfig(min_events_per_user=1, min_events_per_item=1)


def _write(path: Path, text: str, gz: bool = False) -> Path:
    if gz:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


def _events(cfg: DataConfig, path: Path | str, fmt: str | None = None) -> pl.DataFrame:
    """Canonical valid events of an input, in source order."""
    return canonical_events(scan_source(cfg, path, fmt), cfg).collect().sort("source_row").drop(SUBSECOND, strict=False)


# ----------------------------------------------------------------------------- formats


CSV = "user_id,item_id,timestamp\n1,10,100\n1,11,200\n2,10,150\n"


TEXT_FORMAT_CASES = [  # (file name, text, the format it reads as): users [1, 1, 2], items [10, 11, 10]
    ("e.csv", CSV, "csv"),
    ("e.tsv", CSV.replace(",", "\t"), "csv"),
    ("e.ndjson", '{"user_id":1,"item_id":10,"timestamp":100}\n{"user_id":1,"item_id":11,"timestamp":200}\n{"user_id":2,"item_id":10,"timestamp":150}\n', "ndjson"),
    ("ratings.dat", "1::10::5::100\n1::11::3::200\n2::10::4::150\n", "movielens"),
    ("u.data", "1\t10\t5\t100\n1\t11\t3\t200\n2\t10\t4\t150\n", "movielens"),
    ("ratings.csv", "userId,movieId,rating,timestamp\n1,10,5.0,100\n1,11,3.0,200\n2,10,4.0,150\n", "movielens"),
    ("seq.txt", "1 10\n1 11\n2 10\n", "sasrec"),
    ("s3.txt", "1 10 11\n2 10\n", "s3rec"),
]


@pytest.mark.parametrize(("name", "text", "fmt"), TEXT_FORMAT_CASES)
@pytest.mark.parametrize("gz", [False, True])
def test_every_text_format_is_inferred_and_read(tmp_path, name, text, fmt, gz):
    path = _write(tmp_path / (name + (".gz" if gz else "")), text, gz=gz)
    assert infer_format([path]) == fmt
    events = _events(LOOSE, path)
    assert events["user_id"].to_list() == [1, 1, 2]
    assert events["item_id"].to_list() == [10, 11, 10]
    assert events["user_id"].dtype == pl.Int64 and events["item_id"].dtype == pl.Int64
    if fmt in ("sasrec", "s3rec"):
        assert events["timestamp"].to_list() == [0, 1, 2]  # line (event) order is the time
    else:
        assert events["timestamp"].to_list() == [100, 200, 150]
    if fmt == "movielens":
        assert events["value"].to_list() == [5.0, 3.0, 4.0]


def test_parquet_file_directory_and_glob(tmp_path):
    df = pl.DataFrame({"user_id": [1, 1, 2], "item_id": [10, 11, 10], "timestamp": [100, 200, 150]})
    (tmp_path / "d").mkdir()
    df.head(2).write_parquet(tmp_path / "d" / "part-0.parquet")
    df.tail(1).write_parquet(tmp_path / "d" / "part-1.parquet")
    df.write_parquet(tmp_path / "one.parquet")
    for src in (tmp_path / "one.parquet", tmp_path / "d", str(tmp_path / "d" / "part-*.parquet")):
        events = _events(LOOSE, src)
        assert events.select("user_id", "item_id", "timestamp").equals(df), src
        assert events["source_row"].to_list() == [0, 1, 2]
    with open(tmp_path / "one.parquet", "rb") as fh, gzip.open(tmp_path / "one.parquet.gz", "wb") as gz:
        gz.write(fh.read())
    assert _events(LOOSE, tmp_path / "one.parquet.gz").select("user_id", "item_id", "timestamp").equals(df)


def test_format_sniffed_from_contents_without_known_suffix(tmp_path):
    assert infer_format([_write(tmp_path / "a.log", "1::2::3::4\n")]) == "movielens"
    assert infer_format([_write(tmp_path / "b.log", "1\t2\t3\t4\n5\t6\t7\t8\n")]) == "movielens"
    assert infer_format([_write(tmp_path / "c.log", '{"a": 1}\n')]) == "ndjson"
    assert infer_format([_write(tmp_path / "d.log", "user,item\nu,i\n")]) == "csv"
    assert infer_format([_write(tmp_path / "e.log", "1 2\n1 3\n")]) == "sasrec"
    assert infer_format([_write(tmp_path / "f.log", "1 2 3\n2 3\n")]) == "s3rec"
    pl.DataFrame({"a": [1]}).write_parquet(tmp_path / "g.bin")
    assert infer_format([tmp_path / "g.bin"]) == "parquet"


def test_column_map_and_headerless_csv(tmp_path):
    path = _write(tmp_path / "r.csv", "userId,movieId,rating,ts\n1,10,4.5,100\n")
    cfg = DataConfig(columns=ColumnMap(user_id="userId", item_id="movieId", value="rating", timestamp="ts"))
    ev = _events(cfg, path)
    assert ev.row(0, named=True) == {"user_id": 1, "item_id": 10, "timestamp": 100, "value": 4.5, "source_row": 0}
    path = _write(tmp_path / "h.csv", "1,10,100\n2,11,200\n")
    cfg = DataConfig(has_header=False, columns=ColumnMap(user_id="column_1", item_id="column_2", timestamp="column_3"))
    assert _events(cfg, path)["item_id"].to_list() == [10, 11]


def test_s3rec_line_with_several_spaces_and_blank_lines(tmp_path):
    path = _write(tmp_path / "s.txt", "1  5 6\n\n2 7   \n", gz=False)
    ev = _events(LOOSE, path, "s3rec")
    assert ev.select("user_id", "item_id", "timestamp").rows() == [(1, 5, 0), (1, 6, 1), (2, 7, 2)]


def test_s3rec_line_with_a_user_and_no_item_is_a_counted_reject(tmp_path):
    path = _write(tmp_path / "s.txt", "1 5 6\n3\n2 7\n4   \n", gz=False)
    result = prepare(LOOSE, path, tmp_path / "out", fmt="s3rec")
    rejects = pl.read_parquet(tmp_path / "out" / "rejects.parquet")
    assert rejects.select("user_id", "reject_reason").rows() == [("3", "missing_item_id"), ("4", "missing_item_id")]
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["rejects_by_reason"] == {"missing_item_id": 2}
    assert pl.read_parquet(tmp_path / "out" / "events.parquet").select("user_id", "item_id").rows() == [
        (1, 5), (1, 6), (2, 7)]  # fmt: skip
    assert "from 5 s3rec rows (2 rejected" in result.summary()


# ----------------------------------------------------------------------------- ids and timestamps


def test_string_and_integer_ids(tmp_path):
    ints = _events(LOOSE, _write(tmp_path / "i.csv", "user_id,item_id,timestamp\n1,10,1\n-2,0,2\n"))
    assert ints.schema["user_id"] == pl.Int64 and ints["user_id"].to_list() == [1, -2]
    strs = _events(LOOSE, _write(tmp_path / "s.csv", "user_id,item_id,timestamp\nalice,B01,1\n bob ,007,2\n"))
    assert strs.schema["user_id"] == pl.String and strs.schema["item_id"] == pl.String
    assert strs["user_id"].to_list() == ["alice", "bob"]  # text values are stripped
    assert strs["item_id"].to_list() == ["B01", "007"]  # leading zeros: kept as strings
    df = pl.DataFrame({"user_id": ["a", "b"], "item_id": [1, 2], "timestamp": [1, 2]})
    df.write_parquet(tmp_path / "p.parquet")
    typed = _events(LOOSE, tmp_path / "p.parquet")
    assert typed.schema["user_id"] == pl.String and typed.schema["item_id"] == pl.Int64


def test_an_event_dated_after_the_prepare_is_rejected_as_a_future_timestamp(tmp_path):
    """More than a day after the clock of the prepare: rejected (a clock error would set every other event's age in
    the popularity prior); within the day (clock skew) and before: kept."""
    import time

    from recsys_alibi.data.ingest import FUTURE_TIMESTAMP, REJECT_REASON, tag_rows

    now = int(time.time())
    times = [1_600_000_000, now + 3_600, now + 2 * 86_400, 4_102_444_800]  # 2020, in an hour, in 2 days, 2100
    path = _write(tmp_path / "f.csv", "user_id,item_id,timestamp\n" + "".join(f"1,{i},{t}\n" for i, t in enumerate(times)))
    assert _events(LOOSE, path)["timestamp"].to_list() == times[:2]
    reasons = tag_rows(scan_source(LOOSE, path), LOOSE).collect()[REJECT_REASON].to_list()
    assert reasons == [None, None, FUTURE_TIMESTAMP, FUTURE_TIMESTAMP]


def test_timestamps_seconds_milliseconds_iso_and_datetimes(tmp_path):
    text = (
        "user_id,item_id,timestamp\n"
        "1,1,1700000000\n"  # seconds
        "1,2,1700000000123\n"  # ms (> 1e11)
        "1,3,1700000000123456\n"  # us (> 1e14)
        "1,4,2024-01-02T03:04:05Z\n"
        "1,5,2024-01-02 03:04:05\n"  # naive: UTC
        "1,6,2024-01-02T03:04:05+02:00\n"
        "1,7,2024-01-02T03:04:05.750\n"  # fraction floored
        "1,8,2024-01-02\n"
        "1,9,1700000000.9\n"
    )
    ev = _events(LOOSE, _write(tmp_path / "t.csv", text))
    assert ev["timestamp"].to_list() == [
        1700000000, 1700000000, 1700000000, 1704164645, 1704164645, 1704157445, 1704164645, 1704153600, 1700000000,
    ]
    forced = _events(DataConfig(timestamp_unit="ms"), _write(tmp_path / "ms.csv", "user_id,item_id,timestamp\n1,1,5000\n"))
    assert forced["timestamp"].to_list() == [5]
    secs = _write(tmp_path / "s.csv", "user_id,item_id,timestamp\n1,1,1700000000123\n1,2,1700000000\n")
    # forced seconds: 1700000000123 s is some 54,000 years ahead, a future_timestamp (below); auto reads it as ms
    assert _events(DataConfig(timestamp_unit="s"), secs)["timestamp"].to_list() == [1700000000]
    import datetime as dt

    df = pl.DataFrame(
        {
            "user_id": [1, 1],
            "item_id": [1, 2],
            "timestamp": [dt.datetime(2024, 1, 2, 3, 4, 5), dt.datetime(2024, 1, 2, 5, 4, 5)],
        }
    ).with_columns(pl.col("timestamp").dt.replace_time_zone("Europe/Paris").alias("aware"), pl.col("timestamp").alias("naive"))
    df.write_parquet(tmp_path / "dt.parquet")
    naive = _events(DataConfig(columns=ColumnMap(timestamp="naive")), tmp_path / "dt.parquet")
    aware = _events(DataConfig(columns=ColumnMap(timestamp="aware")), tmp_path / "dt.parquet")
    assert naive["timestamp"].to_list() == [1704164645, 1704171845]
    assert aware["timestamp"].to_list() == [1704164645 - 3600, 1704171845 - 3600]  # Paris is UTC+1 in January


def test_missing_timestamp_column_mapped_to_null_uses_line_order(tmp_path):
    path = _write(tmp_path / "n.csv", "user_id,item_id\n1,10\n1,11\n")
    ev = _events(DataConfig(columns=ColumnMap(timestamp=None)), path)
    assert ev["timestamp"].to_list() == [0, 1]


# ----------------------------------------------------------------------------- rejects


def test_each_reject_reason(tmp_path):
    text = (
        "user_id,item_id,timestamp,rating\n"
        "1,10,100,4\n"  # 0 ok
        ",10,100,4\n"  # 1 missing_user_id
        "x,10,100,4\n"  # 2 bad_user_id (ids are integers)
        "1,,100,4\n"  # 3 missing_item_id
        "1,y,100,4\n"  # 4 bad_item_id
        "1,10,yesterday,4\n"  # 5 bad_timestamp
        "1,10,,4\n"  # 6 bad_timestamp (missing)
        "1,10,-5,4\n"  # 7 bad_timestamp (negative)
        "1,10,100,great\n"  # 8 bad_value
        "1,11,101,5\n"  # 9 ok
    )
    path = _write(tmp_path / "bad.csv", text)
    cfg = DataConfig(columns=ColumnMap(value="rating"), id_type="int", min_events_per_user=1, min_events_per_item=1)
    result = prepare(cfg, path, tmp_path / "out")
    rejects = pl.read_parquet(tmp_path / "out" / "rejects.parquet").sort("source_row")
    assert rejects["source_row"].to_list() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert rejects["reject_reason"].to_list() == [
        "missing_user_id", "bad_user_id", "missing_item_id", "bad_item_id",
        "bad_timestamp", "bad_timestamp", "bad_timestamp", "bad_value",
    ]
    assert rejects["user_id"].to_list()[:2] == [None, "x"]  # the raw values are kept
    assert rejects["timestamp"].to_list()[4] == "yesterday"
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["rejects_by_reason"] == {
        "bad_item_id": 1, "bad_timestamp": 3, "bad_user_id": 1, "bad_value": 1, "missing_item_id": 1, "missing_user_id": 1,
    }
    assert result.counts["rejected"] == 8 and result.counts["kept"] == 2 and result.counts["input_rows"] == 10


def test_auto_id_type_keeps_strings_when_a_late_value_is_not_an_integer(tmp_path):
    rows = "".join(f"{u},{u % 7},{u}\n" for u in range(1, 1101)) + "abc,1,5\n"
    path = _write(tmp_path / "late.csv", "user_id,item_id,timestamp\n" + rows)
    result = prepare(LOOSE, path, tmp_path / "out")
    assert not (tmp_path / "out" / "rejects.parquet").exists()  # a string column: 'abc' is a user like the others
    assert result.counts["users"] == 1101 and result.counts["rejected"] == 0
    users = pl.read_parquet(tmp_path / "out" / "sequences.parquet")["user_id"]
    assert users.dtype == pl.String and "abc" in users.to_list() and "1100" in users.to_list()
    items = pl.read_parquet(tmp_path / "out" / "items.parquet")["item_id"]
    assert items.dtype == pl.Int64  # every item id round-trips: integers
    early = _events(LOOSE, _write(tmp_path / "early.csv", "user_id,item_id,timestamp\nabc,1,5\n7,1,6\n"))
    assert early["user_id"].to_list() == ["abc", "7"]


def _late_spellings(fmt: str) -> str:
    """1,100 integer-looking events, then user 01 and items 007, +7, -0 beside 7 and 0."""
    rows = [(u % 9 + 1, u % 50, u) for u in range(1, 1101)] + [(1, "007", 2000), (1, "+7", 2001), ("01", "-0", 2002)]
    if fmt == "csv":
        return "user_id,item_id,timestamp\n" + "".join(f"{u},{i},{t}\n" for u, i, t in rows)
    if fmt == "movielens":
        return "".join(f"{u}::{i}::5::{t}\n" for u, i, t in rows)
    if fmt == "sasrec":
        return "".join(f"{u} {i}\n" for u, i, _ in rows)
    if fmt == "s3rec":
        return "".join(f"{u} {i}\n" for u, i, _ in rows)
    quoted = lambda v: json.dumps(v) if isinstance(v, str) else str(v)  # noqa: E731
    return "".join(f'{{"user_id":{quoted(u)},"item_id":{quoted(i)},"timestamp":{t}}}\n' for u, i, t in rows)


@pytest.mark.parametrize("fmt", ["csv", "movielens", "sasrec", "s3rec", "ndjson"])
def test_distinct_id_spellings_are_never_merged(tmp_path, fmt):
    path = _write(tmp_path / "log.txt", _late_spellings(fmt))
    result = prepare(LOOSE, path, tmp_path / "out", fmt=fmt)
    items = pl.read_parquet(tmp_path / "out" / "items.parquet")["item_id"]
    users = pl.read_parquet(tmp_path / "out" / "sequences.parquet")["user_id"]
    assert items.dtype == pl.String and users.dtype == pl.String
    assert {"007", "+7", "7", "-0", "0"} <= set(items.to_list())  # five items, not two
    assert result.counts["items"] == 50 + 3 and result.counts["users"] == 9 + 1  # user 01 is not user 1
    assert result.counts["rejected"] == 0


def test_integer_ids_stay_integers_and_parquet_strings_stay_strings(tmp_path):
    text = "user_id,item_id,timestamp\n" + "".join(f"{u},{-u},{u}\n" for u in range(1, 2001))
    result = prepare(LOOSE, _write(tmp_path / "ints.csv", text), tmp_path / "out")
    assert pl.read_parquet(tmp_path / "out" / "items.parquet")["item_id"].dtype == pl.Int64
    assert result.counts["items"] == 2000
    big = _events(LOOSE, _write(tmp_path / "big.csv", "user_id,item_id,timestamp\n1,9223372036854775807,1\n1,9223372036854775808,2\n"))
    assert big["item_id"].to_list() == ["9223372036854775807", "9223372036854775808"]  # beyond Int64: strings
    pl.DataFrame({"user_id": ["7", "007"], "item_id": ["1", "1"], "timestamp": [1, 2]}).write_parquet(tmp_path / "s.parquet")
    assert _events(LOOSE, tmp_path / "s.parquet")["user_id"].to_list() == ["7", "007"]


def test_ragged_csv_rows_are_rejected_and_counted(tmp_path):
    text = (
        "user_id,item_id,timestamp,event_type\n"
        "u1,a,1,view\n"  # 0 ok
        "u1,b,2,view,EXTRA\n"  # 1 one extra field
        "u1,c,3,view,x,y\n"  # 2 two extra fields
        "u1,d,4\n"  # 3 short: no event_type field at all
        "u1,e,5,\n"  # 4 ok: an empty event_type
        '"u1","f,g",6,view\n'  # 5 ok: a quoted separator is not a field boundary
        "u1,h,7,view,\n"  # 6 a trailing separator is a fifth field
    )
    result = prepare(DataConfig(columns=ColumnMap(event_type="event_type"), min_events_per_user=1, min_events_per_item=1),
                     _write(tmp_path / "r.csv", text), tmp_path / "out")
    rejects = pl.read_parquet(tmp_path / "out" / "rejects.parquet").sort("source_row")
    assert rejects.select("source_row", "reject_reason").rows() == [
        (1, "bad_field_count"), (2, "bad_field_count"), (3, "bad_field_count"), (6, "bad_field_count")
    ]
    assert rejects["item_id"].to_list() == ["b", "c", "d", "h"]  # raw values kept
    assert "_fields_ok" not in rejects.columns
    assert result.counts["rejected"] == 4 and result.counts["kept"] == 3
    assert result.stats["rejects_by_reason"] == {"bad_field_count": 4}
    events = pl.read_parquet(tmp_path / "out" / "events.parquet")
    assert events["item_id"].to_list() == ["a", "e", "f,g"]


@pytest.mark.parametrize(
    ("fmt", "text", "bad_rows"),
    [
        ("movielens", "1::10::5::100\n1::11::3\n1::12::3::200::9\n", [1, 2]),
        ("movielens", "1\t10\t5\t100\n1\t11\t3\n", [1]),
        ("sasrec", "1 10\n1\n1 11 12\n1\t13\n", [1, 2]),
    ],
)
def test_lines_with_the_wrong_number_of_fields_are_rejected(tmp_path, fmt, text, bad_rows):
    result = prepare(LOOSE, _write(tmp_path / "log.txt", text), tmp_path / "out", fmt=fmt)
    rejects = pl.read_parquet(tmp_path / "out" / "rejects.parquet").sort("source_row")
    assert rejects["source_row"].to_list() == bad_rows
    assert set(rejects["reject_reason"]) == {"bad_field_count"}
    assert result.counts["rejected"] == len(bad_rows)


def test_csv_whose_quoted_fields_span_lines_is_still_read(tmp_path, caplog):
    text = 'user_id,item_id,timestamp,note\nu1,a,1,"two\nlines"\nu1,b,2,plain\nu1,c,3\n'
    result = prepare(LOOSE, _write(tmp_path / "q.csv", text), tmp_path / "out")
    assert result.counts["kept"] == 3 and result.counts["rejected"] == 0  # no field check possible: nothing rejected
    assert "span lines" in caplog.text


def test_files_are_read_in_natural_name_order(tmp_path):
    d = tmp_path / "days"
    d.mkdir()
    for day in (9, 10, 11, 1):
        (d / f"day{day}.txt").write_text(f"1 {day}\n")  # SASRec: the line order is the time
    assert [p.name for p in resolve_paths(d)] == ["day1.txt", "day9.txt", "day10.txt", "day11.txt"]
    assert [p.name for p in resolve_paths(str(d / "day*.txt"))] == ["day1.txt", "day9.txt", "day10.txt", "day11.txt"]
    prepare(LOOSE, d, tmp_path / "out", fmt="sasrec")
    items = pl.read_parquet(tmp_path / "out" / "items.parquet")
    order = pl.read_parquet(tmp_path / "out" / "sequences.parquet")["item_idx"][0].to_list()
    by_idx = dict(zip(items["item_idx"].to_list(), items["item_id"].to_list()))
    assert [by_idx[i] for i in order] == [1, 9, 10, 11]


def test_semicolon_and_pipe_separators_are_detected_and_suggested(tmp_path):
    for sep in (";", "|"):
        path = _write(tmp_path / "s.csv", f"user_id{sep}item_id{sep}timestamp\nu1{sep}a,b{sep}1\nu1{sep}c{sep}2\n")
        assert _events(LOOSE, path)["item_id"].to_list() == ["a,b", "c"]
        assert infer_format([_write(tmp_path / "s.log", f"user{sep}item\nu{sep}i\n")]) == "csv"
    for sep, setting in ((";", "\"data.separator=';'\""), ("|", "\"data.separator='|'\""), ("\t", "data.separator=tab")):
        path = _write(tmp_path / "other.csv", f"user_id{sep}item_id{sep}timestamp\nu1{sep}a{sep}1\n")
        msg = _one_line_error(prepare, DataConfig(separator=","), path, tmp_path / "out")
        named = "tab" if sep == "\t" else f"'{sep}'"  # the setting as a shell passes it on to YAML: ',' and '|' quoted
        assert msg.endswith(f"the header looks {named}-separated: set --set {setting}, or map it with --set "
                            "data.columns.user_id=NAME")
        assert f"[{f'user_id{sep}item_id{sep}timestamp'!r}]" in msg


@pytest.mark.parametrize(("given", "read"), [("tab", "\t"), ("\\t", "\t"), ("|", "|"), (";", ";")])
def test_the_separator_setting_takes_tab_by_name(given, read):
    assert DataConfig(separator=given).separator == read


def test_a_separator_on_a_file_read_as_movielens_is_refused_not_ignored(tmp_path):
    path = _write(tmp_path / "ratings.csv", "userId,movieId,rating,timestamp\n1,10,4.0,100\n")
    assert _one_line_error(prepare, DataConfig(separator="\t"), path, tmp_path / "out") == (
        f"data.separator is set but '{path}' reads as movielens, whose fields are fixed; drop the setting, or read the "
        "file with --format csv")


@pytest.mark.parametrize("given", ["", ";;", "§", "\n", '"'])
def test_a_separator_of_other_than_one_byte_is_refused(given):
    with pytest.raises(ValueError, match="the separator is one single-byte character"):
        DataConfig(separator=given)


def test_a_headerless_file_is_told_apart_from_a_missing_column(tmp_path):
    """MovieLens' u.data saved as .tsv: its first event is taken for the header; the fix says so."""
    path = _write(tmp_path / "w.tsv", "196\t242\t3\t881250949\n186\t302\t3\t891717742\n")
    msg = _one_line_error(prepare, DataConfig(), path, tmp_path / "out")
    assert msg == ("column 'user_id' (data.columns.user_id) is not in the csv input columns ['196', '242', '3', '881250949']; "
                   "its first line looks like data, not a header: set --set data.has_header=false and map the columns "
                   "by position (e.g. --set data.columns.user_id=column_1), or --format movielens for MovieLens' u.data "
                   "/ ratings.dat; else map it with --set data.columns.user_id=NAME")
    repeated = _write(tmp_path / "r.csv", "1,1,1600000000\n1,2,1600000001\n")  # user 1, item 1: a value twice
    msg = _one_line_error(prepare, DataConfig(), repeated, tmp_path / "out")
    assert msg.startswith("column 'user_id' (data.columns.user_id) is not in the csv input columns ['1', '1', "
                          "'1600000000']; its first line looks like data, not a header")  # not Polars' '1_duplicated_0'


def test_a_header_name_with_spaces_is_quoted_and_the_alike_column_suggested(tmp_path):
    path = _write(tmp_path / "h.csv", "User ID,item id ,timestamp\nu1,a,1\nu1,b,2\n")
    msg = _one_line_error(prepare, DataConfig(), path, tmp_path / "out")
    assert msg == ("column 'user_id' (data.columns.user_id) is not in the csv input columns ['User ID', 'item id ', "
                   "'timestamp']; map it with --set 'data.columns.user_id=User ID'")
    mapped = DataConfig(columns=ColumnMap(user_id="User ID", item_id="item id "), min_events_per_user=1, min_events_per_item=1)
    assert _events(mapped, path)["item_id"].to_list() == ["a", "b"]  # the suggested names read the file
    camel = _write(tmp_path / "c.csv", "userId,movieId,timestamp\n1,10,1\n")  # MovieLens' ratings.csv header
    assert _one_line_error(prepare, DataConfig(), camel, tmp_path / "out").endswith(
        "; map it with --set 'data.columns.user_id=userId'")


def _two_day_error(tmp_path, first: str, second: str) -> tuple[Path, str]:
    """The one-line error of prepare on a directory of two CSV files (``a.csv``, ``b.csv``)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    _write(logs / "a.csv", first)
    _write(logs / "b.csv", second)
    return logs, _one_line_error(prepare, DataConfig(), logs, tmp_path / "out")


def test_a_csv_file_with_other_columns_in_a_directory_is_the_one_named(tmp_path):
    logs, msg = _two_day_error(tmp_path, "user_id,item_id,timestamp\nu1,a,1\n", "user_id,item_id,timestamp,rating\nu1,b,2,5\n")
    assert msg == (
        f"'{logs / 'b.csv'}' has other columns than '{logs / 'a.csv'}' ('user_id', 'item_id', 'timestamp', 'rating' "
        "against 'user_id', 'item_id', 'timestamp'); every CSV file of one input has the same header: fix or move that file")


def test_a_grouplens_file_with_its_columns_in_another_order_is_refused_not_swapped(tmp_path):
    logs, msg = _two_day_error(tmp_path, "userId,movieId,rating,timestamp\n1,10,4.0,100\n",
                               "movieId,userId,rating,timestamp\n20,2,5.0,200\n")  # fmt: skip
    assert msg == (
        f"'{logs / 'b.csv'}' starts with the header 'movieId,userId,rating,timestamp', not GroupLens' "
        "'userid,movieid,rating,timestamp': a MovieLens file's fields are read by position; fix the header, or read "
        "the files with --format csv and data.columns")


def test_header_names_with_outer_spaces_are_suggested_in_yaml_quotes_and_an_open_quote_in_the_header_named(tmp_path):
    path = _write(tmp_path / "h.csv", " user_id , item_id ,timestamp\nu1,a,1\nu1,b,2\n")
    assert _one_line_error(prepare, DataConfig(), path, tmp_path / "out").endswith(
        "map it with --set 'data.columns.user_id=\" user_id \"'")
    quoted = _write(tmp_path / "q.csv", 'user_id,"item_id,timestamp\nu1,a,1\nu1,b,2\n')
    assert _one_line_error(prepare, DataConfig(), quoted, tmp_path / "out") == (
        f"'{quoted}' line 1 opens a quoted field (\") that is never closed; close or remove that quote; if its quotes are plain text (usual in TSV), "
        "read it with --set data.quote_char=null")


def test_an_unclosed_quote_names_its_line(tmp_path):
    # a quoted field may span lines (line 2 opens, line 3 closes); line 4's quote is never closed
    path = _write(tmp_path / "q.csv", 'user_id,item_id,timestamp\nu1,"a\nb",1\nu1,"c,2\nu2,d,3\n')
    assert _one_line_error(prepare, DataConfig(), path, tmp_path / "out") == (
        f"'{path}' line 4 opens a quoted field (\") that is never closed; close or remove that quote; if its quotes are plain text (usual in TSV), "
        "read it with --set data.quote_char=null")


def test_ndjson_types_are_read_from_every_line(tmp_path):
    lines = [f'{{"user_id":{u % 5},"item_id":{u},"timestamp":{1700000000 + u},"rating":4,"extra":1}}' for u in range(1500)]
    lines += ['{"user_id":1,"item_id":"007","timestamp":"2024-01-02T03:04:05Z","rating":"5","extra":"x","new":[1]}']
    result = prepare(DataConfig(columns=ColumnMap(value="rating"), min_events_per_user=1, min_events_per_item=1),
                     _write(tmp_path / "late.ndjson", "\n".join(lines) + "\n"), tmp_path / "out")
    assert result.counts["kept"] == 1501 and result.counts["rejected"] == 0
    events = pl.read_parquet(tmp_path / "out" / "events.parquet")
    assert events.schema["item_id"] == pl.String and events.schema["user_id"] == pl.Int64
    late = events.filter(pl.col("item_id") == "007").row(0, named=True)
    assert (late["timestamp"], late["value"]) == (1704164645, 5.0)
    assert events.filter(pl.col("item_id") == "7").height == 1  # 7 and "007" are two items


# ----------------------------------------------------------------------------- fatal errors


def _one_line_error(fn, *args, **kwargs) -> str:
    with pytest.raises(DataError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message
    return message


def test_fatal_errors_are_one_line_with_a_fix(tmp_path):
    out = tmp_path / "out"
    msg = _one_line_error(prepare, LOOSE, tmp_path / "nope.csv", out)
    assert "input not found" in msg and "--input" in msg
    msg = _one_line_error(prepare, LOOSE, str(tmp_path / "*.parquet"), out)
    assert "no files match" in msg
    (tmp_path / "emptydir").mkdir()
    assert "empty input" in _one_line_error(prepare, LOOSE, tmp_path / "emptydir", out)
    assert "empty input" in _one_line_error(prepare, LOOSE, _write(tmp_path / "empty.csv", ""), out)
    assert "empty input" in _one_line_error(prepare, LOOSE, _write(tmp_path / "blank.txt", "\n\n"), out)
    msg = _one_line_error(prepare, LOOSE, _write(tmp_path / "x.csv", "a,b\n1,2\n"), out, fmt="xml")
    assert "unknown format 'xml'" in msg and "--format" in msg
    msg = _one_line_error(prepare, LOOSE, _write(tmp_path / "mystery.bin", "hello\n"), out)
    assert "cannot infer the format" in msg and "--format" in msg
    msg = _one_line_error(prepare, LOOSE, _write(tmp_path / "cols.csv", "user,item_id,timestamp\n1,2,3\n"), out)
    assert "column 'user_id' (data.columns.user_id)" in msg and "--set data.columns.user_id=NAME" in msg
    msg = _one_line_error(prepare, LOOSE, _write(tmp_path / "nots.csv", "user_id,item_id\n1,2\n"), out)
    assert "data.columns.timestamp" in msg and "null" in msg
    msg = _one_line_error(prepare, DataConfig(min_value=4), _write(tmp_path / "mv.csv", CSV), out)
    assert "data.min_value" in msg and "data.columns.value" in msg
    _write(tmp_path / "broken.parquet", "PAR1 this is not parquet")
    assert "cannot read" in _one_line_error(prepare, LOOSE, tmp_path / "broken.parquet", out)
    _write(tmp_path / "broken.csv.gz", "not gzip at all")
    assert "cannot read" in _one_line_error(prepare, LOOSE, tmp_path / "broken.csv.gz", out)
    msg = _one_line_error(prepare, LOOSE, _write(tmp_path / "allbad.csv", "user_id,item_id,timestamp\n,1,2\n1,,2\n"), out)
    assert "all 2 rows were rejected" in msg and "rejects.parquet" in msg
    assert (out / "rejects.parquet").exists()
    msg = _one_line_error(prepare, DataConfig(min_events_per_user=5), _write(tmp_path / "few.csv", CSV), out)
    assert "no events left after cleaning" in msg and "data.min_events_per_user" in msg


def test_resolve_paths_skips_hidden_files(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.csv").write_text(CSV)
    (tmp_path / "d" / ".hidden.csv").write_text("junk")
    (tmp_path / "d" / "_SUCCESS").write_text("")
    assert resolve_paths(tmp_path / "d") == [tmp_path / "d" / "a.csv"]


def test_repeated_lines_without_timestamps_are_reconsumptions_not_duplicates(tmp_path):
    path = _write(tmp_path / "r.txt", "1 5\n1 5\n1 6\n")
    result = prepare(LOOSE, path, tmp_path / "out", fmt="sasrec")
    assert result.counts["deduplicated"] == 0 and result.counts["events"] == 3
    assert result.stats["time_from_line_order"] is True


def test_an_empty_file_among_several_is_named_itself(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    _write(folder / "day1.csv", "user_id,item_id,timestamp\n1,2,3\n")
    _write(folder / "day2.csv", "")  # zero bytes: no header either
    msg = _one_line_error(prepare, LOOSE, folder, tmp_path / "out")
    assert f"empty input: '{folder / 'day2.csv'}' has no rows; remove it from the input" in msg


# ----------------------------------------------------------------------------- NDJSON ids that are no ids


def _ndjson_lines(n: int) -> list[str]:
    return [json.dumps({"user_id": i % 50, "item_id": i % 30, "timestamp": 1000 + i}) for i in range(n)]


@pytest.mark.parametrize("late", [False, True])
def test_ndjson_object_array_or_boolean_id_is_rejected_not_typing_the_column(tmp_path, late):
    bad = [
        '{"user_id":{"a":1},"item_id":3,"timestamp":4}',
        '{"user_id":[7],"item_id":3,"timestamp":4}',
        '{"user_id":2,"item_id":true,"timestamp":4}',
        '{"user_id" : false,"item_id":[1, 2],"timestamp":4}',
        '{"user_id":3,"item_id":4,"timestamp":5,"ctx":{"user_id":[9]}}',  # a nested key of the same name: a good row
    ]
    good = _ndjson_lines(1500)
    lines = good + bad if late else bad + good  # after line 1,000 and within the inferred lines
    result = prepare(LOOSE, _write(tmp_path / "ids.ndjson", "\n".join(lines) + "\n"), tmp_path / "out")
    assert result.counts["rejected"] == 4 and result.counts["kept"] == 1501
    assert result.stats["rejects_by_reason"] == {"bad_item_id": 1, "bad_user_id": 3}
    events = pl.read_parquet(tmp_path / "out" / "events.parquet")
    assert (events.schema["user_id"], events.schema["item_id"]) == (pl.Int64, pl.Int64)
    rejects = pl.read_parquet(tmp_path / "out" / "rejects.parquet").sort("source_row")
    first = 1500 if late else 0
    assert rejects.select("user_id", "item_id", "source_row", "reject_reason").rows() == [
        ('{"a": 1}', "3", first, "bad_user_id"),
        ("[7]", "3", first + 1, "bad_user_id"),
        ("2", "true", first + 2, "bad_item_id"),
        ("false", "[1, 2]", first + 3, "bad_user_id"),  # as Polars writes JSON
    ]
    assert not any(name.startswith("_") for name in rejects.columns)


def test_ndjson_string_ids_that_look_like_json_are_kept_as_strings(tmp_path):
    lines = ['{"user_id":"[7]","item_id":"true","timestamp":1}', '{"user_id":"u","item_id":"{}","timestamp":2}', ""]
    events = _events(LOOSE, _write(tmp_path / "s.ndjson", "\n".join(lines) + "\n"))
    assert events.select("user_id", "item_id", "source_row").rows() == [("[7]", "true", 0), ("u", "{}", 1)]


# ----------------------------------------------------------------------------- CSV headers and rejects


def test_csv_header_with_a_mapped_column_twice_is_refused(tmp_path):
    path = _write(tmp_path / "dup.csv", "user_id,item_id,timestamp,user_id\nu1,i1,1,u9\n")
    msg = _one_line_error(prepare, LOOSE, path, tmp_path / "out")
    assert msg == (f"the header of '{path}' has the column 'user_id' (data.columns.user_id) 2 times; "
                   "rename or remove all but one, or map another column")
    assert not (tmp_path / "out" / "events.parquet").exists()
    path = _write(tmp_path / "extra.csv", "user_id,item_id,timestamp,note,note\nu1,i1,1,a,b\n")  # unmapped: read
    assert _events(LOOSE, path)["user_id"].to_list() == ["u1"]


def test_bad_field_count_reject_points_at_its_line(tmp_path):
    text = "user_id,item_id,timestamp\nu1,i1,1\nu3,i4,7,8\nu1,i2,2\n"
    prepare(LOOSE, _write(tmp_path / "f.csv", text), tmp_path / "out")
    rejects = pl.read_parquet(tmp_path / "out" / "rejects.parquet")
    assert rejects.rows() == [("u3", "i4", "7", 1, "bad_field_count")]  # the extra field 8 is not kept (docs/data.md)
    assert text.splitlines()[rejects["source_row"][0] + 1] == "u3,i4,7,8"  # line source_row + 2, 1-based
