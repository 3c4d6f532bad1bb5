"""Read failures become one-line DataErrors naming the file, line or byte at fault (recsys_alibi.data.errors)."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
from pathlib import Path

import polars as pl
import pytest

from recsys_alibi.config import DataConfig
from recsys_alibi.data.errors import DataError, invalid_utf8
from recsys_alibi.data.prepare import prepare

LOOSE = DataConfig(min_events_per_user=1, min_events_per_item=1)
LATIN1 = "user_id,item_id,timestamp\nu1,caf\xe9,1\nu1,b,2\n".encode("latin-1")


def _error(path, fmt=None) -> str:
    with pytest.raises(DataError) as info:
        prepare(LOOSE, path, path.parent / "out", fmt=fmt)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("gz", [False, True])
def test_non_utf8_text_names_the_file_line_and_byte(tmp_path, gz):
    path = tmp_path / ("latin.csv.gz" if gz else "latin.csv")
    path.write_bytes(gzip.compress(LATIN1) if gz else LATIN1)
    msg = _error(path)
    assert f"'{path}' is not UTF-8 text: byte 0xe9 at line 2 (offset 32)" in msg and "iconv" in msg
    assert str(tmp_path / ("latin.utf8.csv.gz" if gz else "latin.utf8.csv")) in msg


@pytest.mark.parametrize("fmt", [None, "csv", "movielens"])
@pytest.mark.parametrize(("compress", "kind", "unpack"), [(bz2.compress, "bzip2", "bzip2 -dc"), (lzma.compress, "xz", "xz -dc")])
def test_another_compression_than_gzip_is_named_not_called_an_encoding(tmp_path, compress, kind, unpack, fmt):
    # read as text, a .bz2 or .xz is bytes that are not UTF-8: the iconv advice would only make it worse
    path = tmp_path / f"events.csv.{'bz2' if kind == 'bzip2' else kind}"
    path.write_bytes(compress(b"user_id,item_id,timestamp\nu1,a,1\nu1,b,2\n"))
    assert _error(path, fmt) == (f"cannot read '{path}': it is {kind}-compressed and only gzip (.gz) is read; "
                                 f"decompress it first ({unpack} '{path}' > 'events.csv') or recompress it with gzip")


@pytest.mark.parametrize("fmt", [None, "csv"])
def test_a_compressed_file_under_a_text_name_or_in_a_directory_is_refused_whatever_the_format(tmp_path, fmt):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "day1.csv").write_text("user_id,item_id,timestamp\nu1,a,1\n")
    (logs / "day2.csv").write_bytes(bz2.compress(b"user_id,item_id,timestamp\nu1,b,2\n"))  # not named .bz2
    assert _error(logs, fmt) == (f"cannot read '{logs / 'day2.csv'}': it is bzip2-compressed and only gzip (.gz) is "
                                 f"read; decompress it first (bzip2 -dc '{logs / 'day2.csv'}' > 'day2.plain.csv') or "
                                 "recompress it with gzip")


def test_non_utf8_text_in_a_read_only_folder_is_converted_into_the_working_directory(tmp_path, monkeypatch):
    import recsys_alibi.data.errors as errors

    data = tmp_path / "shared"
    data.mkdir()
    path = data / "latin.csv"
    path.write_bytes(LATIN1)
    real_access = errors.os.access
    monkeypatch.setattr(errors.os, "access", lambda p, mode: False if Path(p) == data else real_access(p, mode))
    msg = _error(path)  # the fix must not write into the data's folder (a read-only share, a mount)
    assert msg.endswith(f"iconv -f latin1 -t utf-8 '{path}' > 'latin.utf8.csv'")


def test_non_utf8_header_is_named_not_blamed_on_the_column_map(tmp_path):
    path = tmp_path / "h.csv"
    path.write_bytes("user_id,item_id,début\nu1,a,1\n".encode("latin-1"))
    assert "is not UTF-8 text: byte 0xe9 at line 1" in _error(path)


def test_non_utf8_file_among_several_is_the_one_named(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    (d / "a.csv").write_text("user_id,item_id,timestamp\nu1,a,1\n")
    (d / "b.csv").write_bytes(LATIN1)
    assert f"'{d / 'b.csv'}' is not UTF-8 text" in _error(d)
    sasrec = tmp_path / "seq.txt"
    sasrec.write_bytes(b"1 10\n1 caf\xe9\n")
    assert "is not UTF-8 text: byte 0xe9 at line 2" in _error(sasrec, "sasrec")


def test_invalid_utf8_across_a_chunk_boundary(tmp_path, monkeypatch):
    import recsys_alibi.data.errors as errors

    monkeypatch.setattr(errors, "CHUNK", 4)
    path = tmp_path / "t.txt"
    path.write_bytes("ab\n\u00e9\u00e9\nc".encode() + b"\n\xff\n")  # two-byte characters cut by 4-byte chunks
    assert invalid_utf8(path) == (4, 10, 0xFF)
    path.write_bytes("ab\n\u00e9\u00e9\nc\n".encode())
    assert invalid_utf8(path) is None


def test_ndjson_error_names_the_line(tmp_path):
    path = tmp_path / "e.ndjson"
    path.write_text('{"user_id":1,"item_id":7,"timestamp":1}\n{"user_id":1,"item_id":8,"timestamp":2\n{"user_id":2}\n')
    msg = _error(path)
    assert f"'{path}' line 2 is not valid JSON" in msg


def test_multi_file_parquet_error_names_the_broken_file(tmp_path):
    d = tmp_path / "parts"
    d.mkdir()
    frame = pl.DataFrame({"user_id": [1, 2], "item_id": [3, 4], "timestamp": [5, 6]})
    for k in range(3):
        frame.write_parquet(d / f"part-{k}.parquet")
    data = (d / "part-2.parquet").read_bytes()
    (d / "part-2.parquet").write_bytes(data[:40] + b"\0" * (len(data) - 80) + data[-40:])  # data pages zeroed
    msg = _error(d)
    assert f"cannot read '{d / 'part-2.parquet'}'" in msg
    (d / "part-2.parquet").unlink()
    frame.with_columns(pl.col("item_id").cast(pl.String)).write_parquet(d / "part-1.parquet")
    msg = _error(d)
    assert f"'{d / 'part-1.parquet'}'" in msg and "differ" in msg


def test_ndjson_with_a_byte_order_mark_is_named_with_the_fix(tmp_path):
    path = tmp_path / "bom.ndjson"
    path.write_bytes(b'\xef\xbb\xbf{"user_id":1,"item_id":7,"timestamp":1}\n{"user_id":1,"item_id":8,"timestamp":2}\n')
    msg = _error(path)
    assert f"'{path}' line 1 is preceded by a UTF-8 byte-order mark (BOM)" in msg
    assert "sed -i '1s/^\\xEF\\xBB\\xBF//'" in msg
    gz = tmp_path / "bom.ndjson.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert f"'{gz}' line 1 is preceded by a UTF-8 byte-order mark (BOM), which NDJSON does not allow; remove it, " \
        f"e.g. zcat '{gz}' | sed '1s/^\\xEF\\xBB\\xBF//' | gzip > NEW.gz" in _error(gz)


def _payloads() -> dict[str, tuple[str, bytes]]:
    """(file name, uncompressed bytes) of 400 events in each format."""
    pairs = [(u, (u * 7 + t) % 30, 1000 * u + t) for u in range(20) for t in range(20)]
    parquet = io.BytesIO()
    pl.DataFrame(pairs, schema=["user_id", "item_id", "timestamp"], orient="row").write_parquet(parquet)
    return {
        "csv": ("day.csv", ("user_id,item_id,timestamp\n" + "".join(f"u{u},i{i},{t}\n" for u, i, t in pairs)).encode()),
        "ndjson": ("day.ndjson", "".join(f'{{"user_id": "u{u}", "item_id": {i}, "timestamp": {t}}}\n' for u, i, t in pairs).encode()),
        "movielens": ("day.dat", "".join(f"{u}::{i}::4::{t}\n" for u, i, t in pairs).encode()),
        "sasrec": ("day.txt", "".join(f"{u} {i}\n" for u, i, _ in pairs).encode()),
        "s3rec": ("day.txt", "".join(f"{u} " + " ".join(str(i) for i in range(20)) + "\n" for u in range(20)).encode()),
        "parquet": ("day.parquet", parquet.getvalue()),
    }


@pytest.mark.parametrize("fmt", ["csv", "ndjson", "movielens", "sasrec", "s3rec", "parquet"])
@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
@pytest.mark.parametrize("inferred", [False, True])
def test_a_truncated_or_corrupt_gz_in_an_input_folder_is_one_line_naming_it(tmp_path, fmt, damage, inferred):
    name, payload = _payloads()[fmt]
    folder = tmp_path / "in"
    folder.mkdir()
    whole = gzip.compress(payload)
    (folder / f"1{name}.gz").write_bytes(whole)
    if damage == "truncated":  # an interrupted copy
        broken = whole[: len(whole) * 2 // 3]
    else:  # a flipped byte in the stream's trailer (CRC) makes gzip refuse it at the end
        broken = whole[:-6] + bytes([whole[-6] ^ 0xFF]) + whole[-5:]
    (folder / f"2{name}.gz").write_bytes(broken)
    source = folder / "*.gz" if inferred else folder
    given = None if inferred and fmt not in ("sasrec", "s3rec") else fmt
    message = _error(source, fmt=given)
    assert f"cannot read '{folder / f'2{name}.gz'}': a truncated or corrupt gzip file" in message
    assert "Traceback" not in message


def test_a_truncated_gz_named_first_fails_in_format_sniffing_with_one_line(tmp_path):
    whole = gzip.compress(b"user_id,item_id,timestamp\n" + b"u1,a,1\n" * 50_000)
    path = tmp_path / "events.gz"  # no format in the name: the first lines are sniffed
    path.write_bytes(whole[:200])
    assert f"cannot read '{path}': a truncated or corrupt gzip file" in _error(path)


@pytest.mark.parametrize("number", ["1e400", "-1e400", "9" * 400])
@pytest.mark.parametrize("field", ["user_id", "item_id", "timestamp"])
def test_ndjson_number_beyond_float64_names_the_file_and_line(tmp_path, field, number):
    rows = [{"user_id": 1, "item_id": 7, "timestamp": t} for t in range(3)]
    lines = [json.dumps(row) for row in rows]
    lines.insert(2, json.dumps(rows[0]).replace(f'"{field}": {rows[0][field]}', f'"{field}": {number}'))
    path = tmp_path / "big.ndjson"
    path.write_text("\n".join(lines) + "\n")
    shown = number if len(number) <= 40 else number[:40] + "..."
    assert _error(path) == (f"'{path}' line 3 is not readable: its number {shown} is beyond the float64 range "
                            "NDJSON numbers are read in; fix or remove that line")
