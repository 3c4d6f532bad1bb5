"""Public dataset layouts that were misread or refused unclearly (report break-formats-s66, findings 1, 2, 4-8):
each file is written here, small, and the counts or the refusal's key words are checked exactly."""

from __future__ import annotations

import csv
import gzip
import io
import logging
import tarfile
from pathlib import Path

import polars as pl
import pytest

from pipelines.cli import main
from recsys_alibi.config import ColumnMap, DataConfig
from recsys_alibi.data.errors import DataError
from recsys_alibi.data.quotes import scan_quotes
from recsys_alibi.data.formats import infer_format, resolve_paths
from recsys_alibi.data.prepare import prepare
from recsys_alibi.data.readers import _field_counts

LOOSE = DataConfig(min_events_per_user=1, min_events_per_item=1)
TRACKS = ColumnMap(user_id="user", item_id="track", timestamp="ts")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _error(cfg: DataConfig, path: Path, out: Path, fmt: str | None = None) -> str:
    with pytest.raises(DataError) as info:
        prepare(cfg, path, out, fmt=fmt)
    message = str(info.value)
    assert "\n" not in message and message
    return message


def _ratings(sep: str, width: int) -> str:
    """A ``user item rating [timestamp]`` table without a header: 30 events, users 1-3, items 10-19."""
    rows = [(1 + k % 3, 10 + k % 10, 1 + k % 5, 1_100_000_000 + k) for k in range(30)]
    return "".join(sep.join(str(v) for v in row[:width]) + "\n" for row in rows)


# finding 1: a table is not S3-Rec


@pytest.mark.parametrize(("sep", "width", "setting"), [(" ", 4, "data.separator=' '"), ("\t", 3, "data.separator=tab"),
                                                       (" ", 3, "data.separator=' '")])  # fmt: skip
def test_a_whitespace_rating_table_is_refused_not_read_as_s3rec(tmp_path, sep, width, setting):
    path = _write(tmp_path / "ratings.txt", _ratings(sep, width))
    msg = _error(LOOSE, path, tmp_path / "out")
    assert msg.startswith(f"cannot infer the format of '{path}': it looks like a table ({width} fields on every line")
    assert "not S3-Rec" in msg and "--format csv" in msg and setting in msg and "--format s3rec" in msg
    assert "data.has_header=false" in msg and "data.columns.user_id=column_1" in msg
    assert not (tmp_path / "out" / "events.parquet").exists()


def test_a_space_table_with_a_header_line_is_refused_in_one_line(tmp_path):
    """A header of names ('user item rating') above decimals: the refusal (was an UnboundLocalError, exit 1),
    without the has_header=false advice (the first line is a header)."""
    path = _write(tmp_path / "ratings.txt", "user item rating\n1 2 3.5\n2 3 4.0\n3 1 2.5\n")
    msg = _error(LOOSE, path, tmp_path / "out")
    assert msg.startswith(f"cannot infer the format of '{path}': it looks like a table (3 fields on every line")
    assert "data.has_header=false" not in msg and "column_1" not in msg  # mapped by the header's names
    assert "map the columns by the header (--set data.columns.user_id=USER_COLUMN" in msg
    cfg = DataConfig(format="csv", separator=" ", min_events_per_user=1, min_events_per_item=1,
                     columns=ColumnMap(user_id="user", item_id="item", timestamp=None))  # the reading it names
    assert prepare(cfg, path, tmp_path / "read").counts["kept"] == 3


def test_the_refusal_names_a_working_table_reading_and_real_s3rec_still_infers(tmp_path):
    path = _write(tmp_path / "ratings.txt", _ratings(" ", 4))
    cfg = DataConfig(format="csv", separator=" ", has_header=False, min_events_per_user=1, min_events_per_item=1,
                     columns=ColumnMap(user_id="column_1", item_id="column_2", timestamp="column_4"))  # fmt: skip
    result = prepare(cfg, path, tmp_path / "out")
    assert (result.counts["kept"], result.counts["rejected"]) == (30, 0)
    assert pl.read_parquet(tmp_path / "out" / "items.parquet").height == 10  # items, not ratings or timestamps
    s3rec = _write(tmp_path / "s3.txt", "1 5 6 7\n2 5 6\n3 7 8 9 10 11\n4 5 6 7\n")
    assert infer_format([s3rec]) == "s3rec"
    with pytest.raises(DataError, match="tab-separated fields"):
        infer_format([_write(tmp_path / "tabbed.txt", "1\t5\t6\n2\t5\t7\t9\n")])  # tabs: never S3-Rec
    assert infer_format([_write(tmp_path / "u.txt", "1\t2\t3\t4\n5\t6\t7\t8\n")]) == "movielens"  # u.data stays


def test_the_cli_refuses_a_table_with_exit_2(tmp_path, capsys):
    path = _write(tmp_path / "ratings.txt", _ratings(" ", 4))
    assert main(["prepare", "--input", str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot infer the format") and "looks like a table" in err[0]


# findings 2 and 5: quotes in separated text


def _tracks(sep: str = "\t") -> str:
    rows = [[f"user_{k % 4}", str(1_240_000_000 + k), "Artist", f"Track {k % 7}"] for k in range(40)]
    rows[5][3], rows[8][3], rows[20][3], rows[27][3] = '"Heroes', 'Live"', '"Heroes', '12"'
    return sep.join(["user", "ts", "artist", "track"]) + "\n" + "".join(sep.join(r) + "\n" for r in rows)


def test_a_tsv_quote_that_swallows_lines_is_refused_with_its_line_and_the_fix(tmp_path):
    path = _write(tmp_path / "merge.tsv", _tracks())
    cfg = DataConfig(columns=TRACKS, min_events_per_user=1, min_events_per_item=1)
    assert _error(cfg, path, tmp_path / "out") == (
        f"'{path}' line 7, column 4 ('track'), opens a quoted field (\") that takes in the lines after it, so this "
        "tab-separated file would have fewer rows than lines; if its quotes are plain text, read it with --set "
        "data.quote_char=null, else close that quote")
    result = prepare(cfg.model_copy(update={"quote_char": None}), path, tmp_path / "out")
    assert (result.counts["input_rows"], result.counts["kept"], result.counts["rejected"]) == (40, 40, 0)
    items = set(pl.read_parquet(tmp_path / "out" / "items.parquet")["item_id"])
    assert {'"Heroes', 'Live"', '12"'} <= items and not any("\n" in i for i in items)


def test_a_comma_csv_whose_quote_takes_in_row_shaped_lines_is_read_as_rfc_4180_and_said(tmp_path, caplog):
    """A comma CSV may quote multi-line text holding a line shaped like a row (csv.writer's output of a review
    with a pasted row: verify-s66 N1, refused by 96580fb); it is read as one field, with one warning naming the
    line and the fix for quotes that are text."""
    import csv as csv_module

    with open(tmp_path / "reviews.csv", "w", newline="") as fh:
        writer = csv_module.writer(fh)
        writer.writerow(["user", "item", "text", "ts"])
        for k in range(30):
            writer.writerow([f"u{k % 3}", f"i{k % 4}", "Pros: fast\nu1,i2,nice,150" if k == 10 else "ok", 100 + k])
    cfg = DataConfig(columns=ColumnMap(user_id="user", item_id="item", timestamp="ts"), min_events_per_user=1,
                     min_events_per_item=1)  # fmt: skip
    with caplog.at_level(logging.WARNING):
        result = prepare(cfg, tmp_path / "reviews.csv", tmp_path / "out")
    assert (result.counts["input_rows"], result.counts["kept"], result.counts["rejected"]) == (30, 30, 0)
    assert "line 12, column 3 ('text'), opens a quoted field" in caplog.text and "data.quote_char=null" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # the tracks with stray quotes, comma-separated: read, and said
        merged = prepare(DataConfig(columns=TRACKS, min_events_per_user=1, min_events_per_item=1),
                         _write(tmp_path / "merge.csv", _tracks(",")), tmp_path / "out2")  # fmt: skip
    assert merged.counts["input_rows"] == 30 and "line 7, column 4 ('track'), opens a quoted field" in caplog.text


def test_real_multi_line_review_text_in_a_comma_csv_still_reads_with_its_warning(tmp_path, caplog):
    text = ("user,item,ts,review\n"
            'u1,a,1,"Great, really.\nWould buy again."\n'
            "u1,b,2,short\n"
            'u2,a,3,"Three\n\nparagraphs, with ""quotes"", too"\n'
            "u2,c,4,plain\n")  # fmt: skip
    cfg = DataConfig(columns=ColumnMap(user_id="user", item_id="item", timestamp="ts"), min_events_per_user=1,
                     min_events_per_item=1)  # fmt: skip
    with caplog.at_level(logging.WARNING):
        result = prepare(cfg, _write(tmp_path / "reviews.csv", text), tmp_path / "out")
    assert (result.counts["input_rows"], result.counts["kept"], result.counts["rejected"]) == (4, 4, 0)
    assert "quoted fields span lines" in caplog.text


def test_a_quote_that_closes_inside_a_field_names_line_column_and_fix(tmp_path):
    # Last.fm 1K: tab, no header, the artist '"Weird Al" Yankovic' (column 4)
    artists = ['"Weird Al" Yankovic' if k == 3 else "Sade" for k in range(12)]
    text = "".join(f"user_{k % 2}\t2009-05-0{1 + k % 9}T12:00:00Z\tid\t{artists[k]}\ttid\tTrack {k}\n" for k in range(12))
    path = _write(tmp_path / "lfm.tsv", text)
    cfg = DataConfig(has_header=False, min_events_per_user=1, min_events_per_item=1,
                     columns=ColumnMap(user_id="column_1", item_id="column_6", timestamp="column_2"))  # fmt: skip
    msg = _error(cfg, path, tmp_path / "out")
    assert msg.startswith(f"cannot read '{path}': line 4, column 4 ('column_4'), starts with a quote")
    assert msg.endswith("read it with --set data.quote_char=null, or quote the whole field")
    result = prepare(cfg.model_copy(update={"quote_char": None}), path, tmp_path / "out")
    assert (result.counts["kept"], result.counts["rejected"]) == (12, 0)


def test_quote_char_is_validated_and_only_for_csv():
    assert DataConfig(quote_char=None).quote_char is None and DataConfig().quote_char == '"'
    assert DataConfig(quote_char="'").quote_char == "'"
    for bad in ("ab", "\n"):
        with pytest.raises(ValueError, match="data.quote_char=null"):
            DataConfig(quote_char=bad)
    with pytest.raises(ValueError, match="data.quote_char=null takes effect only with data.format=csv or auto"):
        DataConfig(format="sasrec", quote_char=None)
    with pytest.raises(ValueError, match="data.quote_char and data.separator are both"):
        DataConfig(separator="'", quote_char="'")


# finding 4: fields are counted by the reader's quoting rule


def test_literal_inch_marks_are_not_a_wrong_field_count(tmp_path):
    pairs = [('The 7" Club', '12" Mix') if k % 10 == 0 else ("Sade", "Smooth Operator") for k in range(60)]
    lines = [f"user_{k % 3}\t{1_240_000_000 + k}\t{artist}\t{track}\n" for k, (artist, track) in enumerate(pairs)]
    path = _write(tmp_path / "inch.tsv", "user\tts\tartist\ttrack\n" + "".join(lines))
    result = prepare(DataConfig(columns=TRACKS, min_events_per_user=1, min_events_per_item=1), path, tmp_path / "out")
    assert (result.counts["input_rows"], result.counts["kept"], result.counts["rejected"]) == (60, 60, 0)


@pytest.mark.parametrize(("line", "fields"), [
    ('a\t"b\tc"\td', 3), ('a\tThe 7" Club\t12" Mix\td', 4), ('"x""y\tz"\tb', 2), ('"a"\t"b"\t"c"', 3),
    ('a\t"b"c\td', 3), ("a\t\t", 3),
])  # fmt: skip
def test_the_field_counter_follows_python_csv(tmp_path, line, fields):
    path = _write(tmp_path / "one.tsv", line + "\n")
    counted = _field_counts([path], "\t", False).collect()["_fields"].to_list()
    assert counted == [fields]
    assert len(next(csv.reader([line], delimiter="\t"))) == fields  # the reference


def test_the_quote_scanner_finds_each_kind_of_quote_by_line_and_field(tmp_path):
    path = _write(tmp_path / "q.tsv", 'a\tb\tc\n1\t"x\ty"\t3\n2\tThe 7" Club\t3\n3\t"Weird Al" Y\t3\n4\t"open\n5\t6\t7"\n')
    scan = scan_quotes(path, "\t")
    assert (scan.first.line, scan.first.field) == (2, 2)
    assert (scan.loose.line, scan.loose.field) == (3, 2)
    assert (scan.stray.line, scan.stray.field) == (4, 2)
    assert (scan.spans.line, scan.spans.field) == (5, 2) and scan.swallowed == scan.spans  # line 6 is a whole row
    assert scan.unclosed is None and scan.header == ["a", "b", "c"]


# finding 6: tar archives


@pytest.mark.parametrize("gz", [False, True])
def test_a_tar_archive_is_refused_with_the_extract_command(tmp_path, gz):
    data = b"user_id,item_id,timestamp\nu1,a,1\nu1,b,2\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("events.csv")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    path = tmp_path / ("events.csv.gz" if gz else "events.tar")  # a .tar.gz renamed .csv.gz: gzip, then tar
    path.write_bytes(gzip.compress(buf.getvalue()) if gz else buf.getvalue())
    kind, flags = ("a gzip-compressed tar archive", "xzf") if gz else ("a tar archive", "xf")
    assert _error(LOOSE, path, tmp_path / "out") == (
        f"cannot read '{path}': it is {kind}, not one data file; extract it first (tar {flags} '{path}') and read the "
        "extracted file or folder instead")
    assert _error(LOOSE, path, tmp_path / "out", fmt="csv").startswith(f"cannot read '{path}': it is {kind}")


# finding 7: a header of data


@pytest.mark.parametrize("first", ["B089141000,A0012FAECBD38,2.0,1415322420", "u1,i9,pv,2009-04-19T00:01:13Z"])
def test_a_first_line_with_one_number_or_time_gets_the_has_header_hint(tmp_path, first):
    path = _write(tmp_path / "r.csv", first + "\nB2,A2,3.0,1415322421\n")
    msg = _error(LOOSE, path, tmp_path / "out")
    assert "its first line looks like data, not a header: set --set data.has_header=false" in msg


def test_a_mapped_header_name_that_reads_as_a_value_is_warned_about(tmp_path, caplog):
    path = _write(tmp_path / "r.csv", "B0,A0,2.0,1415322420\nB1,A0,3.0,1415322421\nB2,A1,3.0,1415322422\n")
    cfg = DataConfig(columns=ColumnMap(user_id="A0", item_id="B0", timestamp="1415322420"), min_events_per_user=1,
                     min_events_per_item=1)  # fmt: skip
    with caplog.at_level(logging.WARNING):
        result = prepare(cfg, path, tmp_path / "out")
    assert result.counts["input_rows"] == 2
    assert "the csv header's column '1415322420' is mapped but reads as a value" in caplog.text


# finding 8: the rest


@pytest.mark.parametrize("gz", [False, True])
def test_cr_only_line_ends_are_named_not_called_empty(tmp_path, gz):
    data = b"user_id,item_id,timestamp\ru1,a,1\ru1,b,2\r"
    path = tmp_path / ("mac.csv.gz" if gz else "mac.csv")
    path.write_bytes(gzip.compress(data) if gz else data)
    msg = _error(LOOSE, path, tmp_path / "out")
    assert msg.startswith(f"'{path}' ends its lines with a carriage return (CR) alone") and "tr '\\r' '\\n'" in msg
    assert "empty" not in msg


def test_a_dat_file_of_another_layout_says_its_format_came_from_the_name(tmp_path):
    path = _write(tmp_path / "clicks.dat", "1,2014-04-07T10:51:09.277Z,214536502,0\n1,2014-04-07T10:54:09.868Z,214536500,0\n")
    msg = _error(LOOSE, path, tmp_path / "out")
    assert msg.startswith("all 2 rows were rejected (bad_field_count: 2): ")
    assert f"'{path}' was read as movielens, a format inferred from its name (.dat)" in msg and "pass --format" in msg


def test_a_trailing_separator_on_every_line_is_named(tmp_path):
    path = _write(tmp_path / "t.tsv", "user_id\titem_id\ttimestamp\nu1\ta\t1\t\nu1\tb\t2\t\n")
    msg = _error(LOOSE, path, tmp_path / "out")
    assert msg.startswith("all 2 rows were rejected (bad_field_count: 2): every line of")
    assert "ends with a tab (a trailing separator)" in msg and "sed 's/\\t$//'" in msg


def test_every_timestamp_unreadable_names_the_accepted_forms(tmp_path):
    path = _write(tmp_path / "t.csv", "user_id,item_id,timestamp\nu1,a,11/15/2019 8:55:22 AM\nu1,b,11/15/2019 9:00:00 AM\n")
    msg = _error(LOOSE, path, tmp_path / "out")
    assert msg.startswith("all 2 rows were rejected (bad_timestamp: 2): no timestamp could be read (the first: "
                          "'11/15/2019 8:55:22 AM' in column 'timestamp'); the forms read are integers")
    assert "ISO-8601" in msg and "data.columns.timestamp" in msg


@pytest.mark.parametrize(("text", "words"), [
    ("{'user_id': 'u1', 'item_id': 'a', 'timestamp': 1, 'early': False}\n", "a Python dict literal"),
    ('[{"user_id": "u1", "item_id": "a", "timestamp": 1}]\n', "one JSON array"),
    ('[\n  {"user_id": "u1", "item_id": "a", "timestamp": 1}\n]\n', "the start of a JSON array spread over"),
])  # fmt: skip
def test_a_file_that_is_not_json_lines_as_a_whole_says_so(tmp_path, text, words):
    path = _write(tmp_path / "r.json", text)
    msg = _error(LOOSE, path, tmp_path / "out")
    assert msg.startswith(f"'{path}' line 1 is {words}") and "the file as a whole is not JSON lines" in msg
    assert "remove that line" not in msg


def test_a_dataset_folder_infers_from_its_data_files_not_its_readme(tmp_path):
    folder = tmp_path / "ml-latest-small"
    folder.mkdir()
    _write(folder / "README.txt", "Summary\n=======\nThis dataset describes 5-star ratings\n")
    _write(folder / "LICENSE.md", "terms\n")
    _write(folder / "ratings.csv", "userId,movieId,rating,timestamp\n1,1,4.0,964982703\n1,3,4.0,964981247\n2,3,5.0,964981248\n")
    assert [p.name for p in resolve_paths(folder)] == ["ratings.csv"]
    result = prepare(LOOSE, folder, tmp_path / "out")
    assert (result.counts["input_rows"], result.counts["kept"], result.counts["rejected"]) == (3, 3, 0)


# a dataset's folder given as --input: its event log is named


def test_a_dataset_folder_with_tables_beside_its_ratings_is_refused_naming_the_event_log(tmp_path, capsys):
    """MovieLens' layout (ratings.csv beside movies.csv and tags.csv) is refused before reading, naming the ratings
    file; the named file then prepares. A SASRec log beside its id-mapping file (two integer columns, which parse as
    SASRec lines) was read as one log without a word: 2 mapping lines became events here."""
    folder = tmp_path / "ml-latest"
    folder.mkdir()
    ratings = _write(folder / "ratings.csv", "userId,movieId,rating,timestamp\n" + "".join(
        f"{1 + k % 3},{10 + k % 10},{1 + k % 5},{1_100_000_000 + k}\n" for k in range(30)))
    _write(folder / "movies.csv", "movieId,title,genres\n10,Heat (1995),Action|Crime\n")
    _write(folder / "tags.csv", "userId,movieId,tag,timestamp\n1,10,classic,1100000000\n")
    assert main(["prepare", "--input", str(folder), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: '{folder}' holds tables that are not events beside the event log (movies.csv, tags.csv), "
                   f"and a folder is read as one log: point --input at the event log ('{ratings}'), or move those "
                   "tables out of it"]  # fmt: skip
    assert main(["prepare", "--input", str(ratings), "--output", str(tmp_path / "out"),
                 "--set", "data.min_events_per_user=1", "--set", "data.min_events_per_item=1"]) == 0  # fmt: skip
    sasrec = tmp_path / "sasrec"
    sasrec.mkdir()
    _write(sasrec / "ml.txt", "".join(f"{1 + k % 3} {10 + k % 10}\n" for k in range(30)))
    _write(sasrec / "sas_to_original_items.txt", "1 1193\n2 661\n")
    with pytest.raises(DataError, match=r"\(sas_to_original_items.txt\), and a folder is read as one log"):
        prepare(LOOSE, sasrec, tmp_path / "sas", fmt="sasrec")


def test_parts_of_one_log_get_no_folder_advice(tmp_path, capsys):
    """Files that are all event logs (day parts, two sources of one log) are read together: an error in one is
    reported as it is, not as a dataset's folder."""
    folder = tmp_path / "log"
    folder.mkdir()
    _write(folder / "events_web.csv", "user,item,ts\n1,2,3\n")
    _write(folder / "events_app.csv", "user,item\n1,2\n")
    assert main(["prepare", "--input", str(folder), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has other columns than" in err[0] and "not events" not in err[0]
