"""The lazy reader of each input format: files -> a :class:`Source` of raw columns.

:func:`scan_source` finds the files (:mod:`recsys_alibi.data.formats`), picks the reader of the
format and returns a ``LazyFrame`` of the raw columns plus ``source_row`` (the row's position in
the input) and, for formats with a field count, ``_fields_ok``; nothing but a few sniffed lines
is read. :mod:`recsys_alibi.data.ingest` maps the raw columns onto the canonical ones.

* CSV/TSV, MovieLens, SASRec and S3-Rec are read as text (every column String); NDJSON reads the
  mapped fields as text; Parquet keeps its types.
* an NDJSON id that is an object, an array, true or false gets ``SCALAR_ID[...]`` False (a
  ``bad_user_id`` / ``bad_item_id`` reject); finding them takes one pass over the lines (a regex),
  the one read of a whole input here.
* every Polars reader gets the resolved paths literally (``glob=False``, or :func:`literal`).
* a CSV row with more or fewer fields than the header, or a MovieLens / SASRec line with the
  wrong number of fields, gets ``_fields_ok`` False (a ``bad_field_count`` reject).
* formats without timestamps (SASRec, S3-Rec) have no timestamp column: the line order is the time.
"""

from __future__ import annotations

import csv
import gzip
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from recsys_alibi.config import DataConfig
from recsys_alibi.data.errors import GZIP_ERRORS, DataError, cr_line_ends, not_text, open_bytes, unread_compression
from recsys_alibi.data.read_errors import read_error
from recsys_alibi.data.formats import (
    FORMAT_HELP,
    FORMATS,
    MOVIELENS_CSV_HEADER,
    check_no_lookup_tables,
    format_reason,
    head_bytes,
    header_separator,
    infer_format,
    is_movielens_csv,
    is_number,
    literal,
    resolve_paths,
    stem_suffix,
)
from recsys_alibi.data.schema import EVENT_TYPE, ITEM_ID, REJECT_REASON, SOURCE_ROW, TIMESTAMP, USER_ID, VALUE

log = logging.getLogger(__name__)

FIELDS_OK = "_fields_ok"  # internal: False for a line/row with the wrong number of fields
INFER_ROWS = 1000  # NDJSON lines read to infer the column types (mapped columns are then read as text)
# internal: False where an NDJSON id is an object, an array, true or false (a bad_user_id / bad_item_id)
SCALAR_ID = {USER_ID: "_user_id_scalar", ITEM_ID: "_item_id_scalar"}
INTERNAL = (SOURCE_ROW, FIELDS_OK, *SCALAR_ID.values())
JSON_BLANK = " \t\r"  # a line of only these is skipped by the NDJSON reader (JSON whitespace)
BOM = "\ufeff"  # a UTF-8 byte-order mark (a Windows editor's): dropped where a line of a line format starts
# names the readers give columns of their own: an input column so named is not read unless mapped (then refused)
RESERVED = (*INTERNAL, "_fields", REJECT_REASON)
RESERVED_PREFIX = "_c_"  # canonical columns while the raw ones are still needed (recsys_alibi.data.ingest)


@dataclass(frozen=True)
class Source:
    """A lazily scanned input.

    Attributes:
        frame: raw columns, ``source_row`` Int64 (0-based position of the event in the input)
            and, for formats with a field count, ``_fields_ok`` Boolean.
        fmt: the format it was read as.
        columns: canonical name -> raw column name (absent: not in this input).
        paths: the files read, in reading order.
        text: True when every raw column was read as a string (text formats).
        raw_columns: the source's own columns (what a rejects file keeps).
        text_ids: canonical id columns read as text whose type ``data.id_type: auto`` decides
            after reading (:func:`integer_id_columns`): Int64 when every value round-trips.
        inferred: how ``format: auto`` chose ``fmt`` (``"from its name (.dat)"``), for messages; None when given.
        csv_read: a CSV's ``separator``, ``quote`` and ``has_header`` (how its failures are explained).
    """

    frame: pl.LazyFrame
    fmt: str
    columns: dict[str, str]
    paths: tuple[Path, ...]
    text: bool
    raw_columns: tuple[str, ...] = field(default=())
    text_ids: tuple[str, ...] = field(default=())
    inferred: str | None = None  # how the format was inferred ("from its name (.dat)"); None: given
    csv_read: dict = field(default_factory=dict)  # a CSV's separator, quote and has_header (read_error's arguments)


class QuotedLinesError(DataError):
    """A CSV record spans several lines (a quoted newline): its fields cannot be counted per line."""


Read = tuple[pl.LazyFrame, dict[str, str], bool, tuple[str, ...]]  # frame, columns, text, text ids


def scan_source(
    cfg: DataConfig, input_path: str | Path | list[Path], fmt: str | None = None, *, count_fields: bool = True
) -> Source:
    """Scan the input lazily; nothing but a few sniffed lines is read here (NDJSON: also one regex
    pass over the lines, for ids that are objects, arrays or booleans).

    Args:
        cfg: ``format``, ``columns``, ``separator``, ``has_header``, ``id_type`` are used.
        input_path: a file, a directory, or a glob; or the files themselves, in reading order.
        fmt: overrides ``cfg.format``; ``None`` or ``"auto"`` infers it.
        count_fields: check each CSV row's number of fields against the header (off only for
            a CSV whose quoted fields span lines, see :class:`QuotedLinesError`).

    Raises:
        DataError: missing input, unknown format, unreadable file (naming the file, and the line
            or byte where it can), empty input, missing column.
    """
    paths = list(input_path) if isinstance(input_path, (list, tuple)) else resolve_paths(input_path)
    check_no_lookup_tables(input_path, paths)
    fmt = fmt or cfg.format
    for path in paths:  # bzip2, xz, zstd, zip under any name, any format: refused before anything reads them
        compressed = unread_compression(path)
        if compressed is not None:
            raise compressed
    inferred = None
    if fmt == "auto":
        fmt = infer_format(paths)
        inferred = format_reason(paths[0], fmt)
        if cfg.separator is not None and fmt != "csv":  # never a setting silently ignored
            raise DataError(f"data.separator is set but '{paths[0]}' reads as {fmt}, whose fields are fixed; drop the "
                            "setting, or read the file with --format csv")  # fmt: skip
    if fmt not in FORMATS:
        raise DataError(f"unknown format '{fmt}'; {FORMAT_HELP} (or auto)")
    for path in paths if fmt != "parquet" else ():  # a Parquet or gzip file read as text: its bytes would be rows
        binary = not_text(path) or cr_line_ends(path)
        if binary is not None:
            raise binary
    try:
        if fmt == "csv":
            frame, columns, text, text_ids = _read_csv(cfg, paths, count_fields)
        else:
            frame, columns, text, text_ids = _READERS[fmt](cfg, paths)
        schema = frame.collect_schema()
    except DataError:
        raise
    except (pl.exceptions.PolarsError, ValueError, *GZIP_ERRORS) as err:  # a gzipped Parquet file is read by Python's gzip
        if isinstance(err, pl.exceptions.NoDataError):  # name the empty file, not the first one
            empty = next((p for p in paths if not head_bytes(p, 1)), paths[0])
            fix = "point --input at the event log" if len(paths) == 1 else "remove it from the input"
            raise DataError(f"empty input: '{empty}' has no rows; {fix}") from None
        csv_read = _csv_reading(cfg, paths) if fmt == "csv" else {}
        if fmt == "csv" and cfg.has_header and len(paths) > 1:
            _check_same_header(paths, csv_read["separator"], cfg.quote_char)
        raise read_error(paths, fmt, err, f"check the file or {FORMAT_HELP}", **csv_read) from None
    raw = tuple(name for name in schema.names() if name not in INTERNAL)
    if text and any("\ufffd" in name for name in raw):  # polars replaced bytes of a non-UTF-8 header
        raise read_error(paths, fmt, ValueError("the header is not UTF-8"), "convert the file to UTF-8")
    if fmt == "csv" and any("\n" in name for name in raw):  # a quote opened in the header took the lines after it
        raise read_error(paths, fmt, ValueError("a header name spans lines"), "close the quote in the header",
                         **_csv_reading(cfg, paths))  # fmt: skip
    header = raw
    if fmt == "csv" and cfg.has_header:  # the names as written: Polars renames a repeated one ('1_duplicated_0')
        header = tuple(_csv_header(paths[0], _separator(cfg, paths), cfg.quote_char))
        header = (header[0].removeprefix("\ufeff"), *header[1:]) if header else raw
    _check_columns(cfg, fmt, columns, raw, header)
    if text and cfg.id_type != "auto":
        text_ids = ()
    return Source(frame=frame, fmt=fmt, columns=columns, paths=tuple(paths), text=text, raw_columns=raw,
                  text_ids=text_ids, inferred=inferred, csv_read=_csv_reading(cfg, paths) if fmt == "csv" else {})  # fmt: skip


def _csv_reading(cfg: DataConfig, paths: list[Path]) -> dict:
    """How a CSV input is read, as :func:`recsys_alibi.data.read_errors.read_error` takes it."""
    return {"separator": _separator(cfg, paths), "quote": cfg.quote_char, "has_header": cfg.has_header}


def _with_row(lf: pl.LazyFrame) -> pl.LazyFrame:
    return lf.with_row_index(SOURCE_ROW).with_columns(pl.col(SOURCE_ROW).cast(pl.Int64))


def _mapped(cfg: DataConfig) -> dict[str, str]:
    cols = cfg.columns
    mapping = {USER_ID: cols.user_id, ITEM_ID: cols.item_id}
    for canon, raw in ((TIMESTAMP, cols.timestamp), (EVENT_TYPE, cols.event_type), (VALUE, cols.value)):
        if raw is not None:
            mapping[canon] = raw
    return mapping


ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}.*)?")  # 2009-04-19, 2009-04-19T00:01:13Z


def looks_like_value(cell: str) -> bool:
    """Whether a header cell reads as a value, not a name: a number (``2.0``, ``1415322420``) or a timestamp
    (``2009-04-19T00:01:13Z``). A header with one such cell is likely the first event (no header line)."""
    text = cell.strip().strip('"')
    return is_number(text) or ISO_DATE.fullmatch(text) is not None


def _plain_name(name: str) -> str:
    """A column name compared loosely: case, outer spaces, ' ' / '-' against '_' and camelCase (``userId``,
    ``UserID``: MovieLens' and RecBole's spellings) against snake_case do not count."""
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name.strip())
    return "_".join(words.lower().replace("-", " ").replace("_", " ").split())


def _check_columns(cfg: DataConfig, fmt: str, columns: dict[str, str], raw: tuple[str, ...],
                   header: tuple[str, ...]) -> None:  # fmt: skip
    """Refuse a source column mapped twice, and a mapped column missing from ``raw`` (the reader's names), shown
    and matched against ``header`` (the names as the file writes them)."""
    first_key: dict[str, str] = {}
    for canon, name in columns.items():  # user_id=item_id by a typo: each user would be an item
        if name in first_key:
            raise DataError(f"data.columns.{first_key[name]} and data.columns.{canon} both name the column '{name}'; "
                            "map each to a column of its own")  # fmt: skip
        first_key[name] = canon
    for canon, name in columns.items():
        if name not in raw:
            shown = ", ".join(repr(col if len(col) <= 60 else col[:60] + "...") for col in header[:12])  # 'user id', 'a\tb'
            shown += ", ..." if len(header) > 12 else ""
            fix = f"map it with --set data.columns.{canon}=NAME"
            alike = [col for col in header if _plain_name(col) == _plain_name(name)]
            if alike:  # 'User ID', ' user_id', 'user-id': the shell needs the name quoted
                value = f'"{alike[0]}"' if alike[0] != alike[0].strip() else alike[0]  # YAML keeps outer spaces only quoted
                fix = f"map it with --set 'data.columns.{canon}={value}'"
            elif canon == TIMESTAMP:
                fix += " (or null to use the line order as time)"
            elif canon in (EVENT_TYPE, VALUE):
                fix += " (or null when the input has none)"
            other = header_separator(header[0]) if fmt == "csv" and len(header) == 1 else None
            if other is not None:  # the header was not split: another separator
                named, setting = (("tab", "data.separator=tab") if other == "\t"  # ',' and '|' need YAML's quotes
                                  else (f"'{other}'", f"\"data.separator='{other}'\""))  # fmt: skip
                fix = f"the header looks {named}-separated: set --set {setting}, or {fix}"
            elif fmt == "csv" and any(looks_like_value(col) for col in header):  # the first line is an event, not names
                fix = ("its first line looks like data, not a header: set --set data.has_header=false and map the "
                       "columns by position (e.g. --set data.columns.user_id=column_1), or --format movielens for "
                       f"MovieLens' u.data / ratings.dat; else {fix}")  # fmt: skip
            raise DataError(f"column '{name}' (data.columns.{canon}) is not in the {fmt} input columns [{shown}]; {fix}")
    valued = [name for name in columns.values() if fmt == "csv" and cfg.has_header and looks_like_value(name)]
    if valued:  # mapped to a header "name" that is a value: the first line is likely an event read as the header
        log.warning("the csv header's column '%s' is mapped but reads as a value, not a name: if the first line is an "
                    "event, it is not read as one; set data.has_header=false and map columns as column_1, column_2, "
                    "...", valued[0])  # fmt: skip
    if cfg.min_value is not None and VALUE not in columns:
        raise DataError("data.min_value is set but the input has no value column; map one with --set data.columns.value=NAME")


def _without_reserved(lf: pl.LazyFrame, cfg: DataConfig) -> pl.LazyFrame:
    """``lf`` without the input columns named like the readers' own (:data:`RESERVED`, ``_c_*``): a rejects file
    fed back carries an earlier run's ``source_row`` and ``reject_reason``; this run writes its own.

    Raises:
        DataError: such a column is mapped by ``data.columns``.
    """
    reserved = [n for n in lf.collect_schema().names() if n in RESERVED or n.startswith(RESERVED_PREFIX)]
    for canon, raw in _mapped(cfg).items():
        if raw in reserved:
            raise DataError(f"column '{raw}' (data.columns.{canon}) has a name the reader gives a column of its own "
                            f"({', '.join(RESERVED)}, _c_*); rename it in the input")  # fmt: skip
    return lf.drop(reserved) if reserved else lf


def _read_parquet(cfg: DataConfig, paths: list[Path]) -> Read:
    plain = [p for p in paths if not stem_suffix(p)[1]]
    if len(plain) == len(paths):
        lf = pl.scan_parquet(paths, hive_partitioning=False, glob=False)  # resolved paths: never globs again
    else:  # Parquet compresses inside; a gzipped Parquet file is read whole into memory
        frames = []
        for p in paths:
            if stem_suffix(p)[1]:
                with gzip.open(p, "rb") as fh:
                    frames.append(pl.read_parquet(fh.read()).lazy())
            else:
                frames.append(pl.scan_parquet(p, glob=False))
        lf = pl.concat(frames, how="vertical")
    lf = _without_reserved(lf, cfg)
    schema = lf.collect_schema()
    mapped = _mapped(cfg)
    # uint64 ids (64-bit hashes) may pass Int64: typed like text ids, Int64 only when every value fits
    wide = tuple(c for c in (USER_ID, ITEM_ID) if schema.get(mapped[c]) == pl.UInt64 and cfg.id_type == "auto")
    return _with_row(lf), mapped, False, wide


def _separator(cfg: DataConfig, paths: list[Path]) -> str:
    """``data.separator``; else tab for ``.tsv``; else the first of ``SEPARATORS`` in the header line."""
    if cfg.separator is not None:
        return cfg.separator
    name, _ = stem_suffix(paths[0])
    if name.endswith(".tsv"):
        return "\t"
    return header_separator(_first_line(paths[0])) or ","


def _byte(char: str) -> str:
    """A one-byte character as a regex escape (``\\x{09}``): any separator or quote, never a regex operator."""
    return f"\\x{{{ord(char):02X}}}"


def quoted_fields_pattern(separator: str, quote: str) -> str:
    """A regex of each quoted field with the separator or line start before it (group 1).

    By the rule of Python's ``csv`` and Polars: a quote is special only where a field starts (so
    ``The 7" Club`` is plain text); inside, ``""`` is a quote.
    """
    q = _byte(quote)
    return f"(^\\x{{FEFF}}?|{_byte(separator)}){q}(?:[^{q}]|{q}{q})*{q}"


def _field_counts(paths: list[Path], separator: str, skip_header: bool, quote: str | None = '"') -> pl.LazyFrame:
    """(rows,) Int64 ``_fields``: fields per line of the files (separators inside quoted fields not counted)."""
    frames = [pl.scan_lines(p, glob=False).slice(1) if skip_header else pl.scan_lines(p, glob=False) for p in paths]
    line = pl.col("line")
    if quote is not None:  # each quoted field removed, the separator before it kept
        line = line.str.replace_all(quoted_fields_pattern(separator, quote), "${1}")
    return pl.concat(frames, how="vertical").select(line.str.count_matches(separator, literal=True).alias("_fields") + 1)


def with_field_check(lf: pl.LazyFrame, paths: list[Path], separator: str, skip_header: bool, width: int,
                     quote: str | None = '"') -> pl.LazyFrame:  # fmt: skip
    """``lf`` (the rows of CSV ``paths``) with ``_fields_ok``: whether the row's line has ``width`` fields.

    Collecting it raises ``pl.exceptions.ShapeError`` when the rows are not the lines (a quoted field spans lines).
    """
    counts = _field_counts(paths, separator, skip_header, quote)
    return pl.concat([lf, counts], how="horizontal").select(pl.exclude("_fields"), (pl.col("_fields") == width).alias(FIELDS_OK))


def _first_line(path: Path) -> str:
    """The first line of a text file (plain or gzip; bytes that are not UTF-8 replaced), without its line end."""
    lines = head_bytes(path, 1 << 16).decode("utf-8", "replace").splitlines()
    return lines[0] if lines else ""


def _csv_header(path: Path, separator: str, quote: str | None = '"') -> list[str]:
    """The fields of a CSV file's first line (quotes honoured, unless ``quote`` is None)."""
    quoting = {"quotechar": quote} if quote is not None else {"quoting": csv.QUOTE_NONE}
    return next(csv.reader([_first_line(path)], delimiter=separator, **quoting), [])


def _check_same_header(paths: list[Path], separator: str, quote: str | None = '"') -> None:
    """Name the first CSV file whose header differs from the first file's (Polars' error names the first file).

    Raises:
        DataError: naming both files and both headers.
    """
    first = _csv_header(paths[0], separator, quote)
    for path in paths[1:]:
        other = _csv_header(path, separator, quote)
        if any("\ufffd" in name for name in (*first, *other)):  # not UTF-8 text (a Parquet file): read_error says so
            return
        if other != first:
            raise DataError(
                f"'{path}' has other columns than '{paths[0]}' ({', '.join(map(repr, other))} against "
                f"{', '.join(map(repr, first))}); every CSV file of one input has the same header: fix or move that file"
            )


def _check_header_unique(cfg: DataConfig, path: Path, separator: str) -> None:
    """Refuse a header that names a mapped column twice: Polars renames the second one
    (``user_id_duplicated_0``) and the first would be read without a word.

    Raises:
        DataError: naming the column and its ``data.columns`` key.
    """
    header = _csv_header(path, separator, cfg.quote_char)
    for canon, raw in _mapped(cfg).items():
        if header.count(raw) > 1:
            raise DataError(
                f"the header of '{path}' has the column '{raw}' (data.columns.{canon}) {header.count(raw)} times; "
                "rename or remove all but one, or map another column"
            )


def _read_csv(cfg: DataConfig, paths: list[Path], count_fields: bool = True) -> Read:
    """CSV/TSV, every column as text; with ``count_fields`` each row's field count is checked.

    Polars pads a short row with nulls and (``truncate_ragged_lines``) drops a long row's extra
    fields; so the fields of each line are counted beside it (``_fields_ok``) and a row whose
    count differs from the header's is rejected (``bad_field_count``).
    """
    separator = _separator(cfg, paths)
    lf = pl.scan_csv(
        paths,
        separator=separator,
        has_header=cfg.has_header,
        infer_schema=False,  # every column as String: bad values become rejects, not read errors
        glob=False,  # resolved paths: 'we[1].csv' is that file
        truncate_ragged_lines=True,
        raise_if_empty=True,
        quote_char=cfg.quote_char,
    )
    names = lf.collect_schema().names()
    if cfg.has_header:
        _check_header_unique(cfg, paths[0], separator)
        lf = _without_reserved(lf, cfg)
    if not cfg.has_header:  # name columns column_1, column_2, ... whatever the polars version
        lf = lf.rename({old: f"column_{i}" for i, old in enumerate(names, start=1)})
    if count_fields:
        lf = with_field_check(lf, paths, separator, cfg.has_header, len(names), cfg.quote_char)
    return _with_row(lf), _mapped(cfg), True, (USER_ID, ITEM_ID)


def _read_ndjson(cfg: DataConfig, paths: list[Path]) -> Read:
    """One JSON object per line; only the mapped fields are read, as text, so a late type change is no error.

    Which fields exist and whether an id field holds numbers is read from the first
    ``INFER_ROWS`` lines (:func:`_ndjson_fields`; a mapped field absent there is reported
    missing); then only the mapped fields are read, each as String (a JSON number as its text),
    so a string timestamp or id after those lines, or an unmapped field that changes type, is
    parsed like any other line. Id fields that were numbers there are typed later by
    :func:`integer_id_columns` (Int64 when every value round-trips); string ids stay strings.
    An id that is an object, an array, ``true`` or ``false`` is no id: its row gets
    ``SCALAR_ID[...]`` False (a ``bad_user_id`` / ``bad_item_id`` reject), wherever it is, so
    it never decides the column's type (:func:`_non_scalar_rows`). A rejects file holds the
    mapped fields only.
    """
    mapped = _mapped(cfg)
    keys, texts = _ndjson_fields(paths)
    if not keys:  # no line with a field: blank, or only {} (Polars: "cannot infer NDJSON types on empty reader")
        raise DataError(f"empty input: {', '.join(repr(str(p)) for p in paths[:3])} has no JSON object with a field; "
                        "point --input at the event log")  # fmt: skip
    present = [raw for raw in mapped.values() if raw in keys]
    # every field as text; no mapped field there: all of them, so the error lists what the input has
    schema = {raw: pl.String for raw in (present or keys)}
    files = [literal(p) for p in paths]  # scan_ndjson always globs
    lf = pl.scan_ndjson(files, schema=schema) if schema else pl.scan_ndjson(files, infer_schema_length=INFER_ROWS)
    text_ids = tuple(c for c in (USER_ID, ITEM_ID) if mapped[c] in present and mapped[c] not in texts)
    lf = _with_row(lf)
    ids = {canon: mapped[canon] for canon in (USER_ID, ITEM_ID) if mapped[canon] in present}
    for canon, rows in _non_scalar_rows(paths, ids).items():
        lf = lf.with_columns(pl.col(SOURCE_ROW).is_in(pl.Series(rows, dtype=pl.Int64).implode()).not_().alias(SCALAR_ID[canon]))
    return lf, mapped, False, text_ids


def _ndjson_fields(paths: list[Path]) -> tuple[list[str], set[str]]:
    """(every field of the first ``INFER_ROWS`` non-blank lines, in order; those holding a JSON string there).

    Read with Python's ``json`` rather than the Polars inference, which fails on an id that is
    an object in one line and a number in another ("failed to determine supertype") and would
    let an object or array decide a column's type. Only scalar values count: a field whose
    values there are numbers (or null, or objects) is typed by :func:`integer_id_columns`.

    Raises:
        DataError: a line there that is not a JSON object (naming the file and line, via :func:`read_error`).
    """
    keys: dict[str, None] = {}
    texts: set[str] = set()
    seen = 0
    for path in paths:
        with open_bytes(path) as fh:
            for raw in fh:
                if not raw.strip(JSON_BLANK.encode() + b"\n"):
                    continue
                try:
                    row = json.loads(raw.decode("utf-8"))  # utf-8, not utf-8-sig: a BOM is an error, as for Polars
                    if not isinstance(row, dict):
                        raise ValueError(f"a JSON {type(row).__name__}, not an object")
                except ValueError as err:
                    raise read_error(paths, "ndjson", err, "fix or remove that line") from None
                keys.update(dict.fromkeys(row))
                texts.update(key for key, value in row.items() if isinstance(value, str))
                seen += 1
                if seen >= INFER_ROWS:
                    return list(keys), texts
    return list(keys), texts


def _json_key_pattern(name: str) -> str:
    """A regex matching ``"name":`` followed by an object, an array, true or false (as JSON writes it)."""
    key = "".join("\\" + ch if ch in r"\.+*?()|[]{}^$#&-~" else ch for ch in json.dumps(name, ensure_ascii=False))
    return key + r"\s*:\s*(?:[\[{]|true|false)"


def _non_scalar_rows(paths: list[Path], ids: dict[str, str]) -> dict[str, list[int]]:
    """Rows (``source_row``) whose id field is an object, an array, true or false, per canonical id.

    The NDJSON reader gives such a value as its JSON text (``[7]``, ``{"a": 1}``, ``true``), the
    same text as a string id spelled so; only the line tells them apart. One pass over the lines
    (a regex, no JSON parsing: about a third of the time of a read) finds the candidates, and
    Python's ``json`` decides on those few (the key may also be a nested object's). Rows are
    counted as the NDJSON reader counts them: blank lines skipped. A line that is no JSON is
    left to the read, which reports it.
    """
    if not ids:
        return {}
    line = pl.col("line")
    candidates = (
        pl.scan_lines(paths, glob=False)
        .filter(line.str.strip_chars(JSON_BLANK) != "")
        .with_row_index(SOURCE_ROW)
        .filter(pl.any_horizontal(line.str.contains(_json_key_pattern(raw)) for raw in ids.values()))
        .collect(engine="streaming")
    )
    found: dict[str, list[int]] = {}
    for row, text in candidates.iter_rows():
        try:
            values = json.loads(text)
        except ValueError:
            continue
        for canon, raw in ids.items():
            if isinstance(values, dict) and isinstance(values.get(raw), (dict, list, bool)):
                found.setdefault(canon, []).append(row)
    return found


def _split_lines(
    paths: list[Path], pattern: str, names: list[tuple[int, str]], fields: int, skip: str | None = None
) -> pl.LazyFrame:
    """A text file whose fields are separated by the regex ``pattern``, known by position.

    Blank lines are skipped, and so are lines equal to ``skip`` ignoring case (a header);
    ``_fields_ok`` is False for a line with other than ``fields`` fields.
    """
    line = pl.col("line").str.strip_chars_start(BOM).str.strip_chars()
    parts = line.str.replace_all(pattern, "\x1f").str.split("\x1f")  # a regex split: mark, then split
    keep = (line != "") if skip is None else (line != "") & (line.str.to_lowercase() != skip)
    lf = pl.scan_lines(paths, glob=False).filter(keep).select(parts.alias("_parts"))
    picked = [pl.col("_parts").list.get(i, null_on_oob=True).alias(name) for i, name in names]
    return lf.select(*picked, (pl.col("_parts").list.len() == fields).alias(FIELDS_OK))


def _read_movielens(cfg: DataConfig, paths: list[Path]) -> Read:
    """``ratings.dat`` (``u::i::r::t``), tab-separated ``u.data`` or GroupLens ``ratings.csv``
    (header ``userId,movieId,rating,timestamp``, skipped): four fields per line."""
    head = head_bytes(paths[0], 4096).decode("utf-8", "replace")
    names = [USER_ID, ITEM_ID, VALUE, TIMESTAMP]
    separator = "::" if "::" in head else "," if is_movielens_csv(head) else "\t"
    if separator == ",":
        _check_grouplens_headers(paths)
    lf = _split_lines(paths, separator, list(enumerate(names)), 4, skip=MOVIELENS_CSV_HEADER)
    return _with_row(lf), {n: n for n in names}, True, (USER_ID, ITEM_ID)


def _check_grouplens_headers(paths: list[Path]) -> None:
    """Refuse a GroupLens CSV among others whose header is another (``movieId,userId,...``): its fields are read
    by position, so its users and items would be swapped without a word.

    Raises:
        DataError: naming the file and its header.
    """
    for path in paths:
        first = _first_line(path).strip()
        field = first.split(",", 1)[0].strip().strip('"')
        if first and not is_movielens_csv(first) and not is_number(field):
            raise DataError(
                f"'{path}' starts with the header {first[:80]!r}, not GroupLens' {MOVIELENS_CSV_HEADER!r}: a MovieLens "
                "file's fields are read by position; fix the header, or read the files with --format csv and "
                "data.columns"
            )


def _read_sasrec(cfg: DataConfig, paths: list[Path]) -> Read:
    """``user item`` per line (spaces or tabs), each user's lines in time order; the line order is the time."""
    lf = _split_lines(paths, r"\s+", [(0, USER_ID), (1, ITEM_ID)], 2)
    return _with_row(lf), {USER_ID: USER_ID, ITEM_ID: ITEM_ID}, True, (USER_ID, ITEM_ID)  # no timestamp: line order


def _read_s3rec(cfg: DataConfig, paths: list[Path]) -> Read:
    """``user item item ...`` per line in time order; one event per item, the event order is the time."""
    line = pl.col("line").str.strip_chars_start(BOM)
    tokens = line.str.replace_all(r"\s+", " ").str.strip_chars().str.split(" ")
    lf = (
        pl.scan_lines(paths, glob=False)
        .filter(line.str.strip_chars() != "")
        .select(tokens.list.first().alias(USER_ID), tokens.list.slice(1).alias(ITEM_ID))
        .explode(ITEM_ID, empty_as_null=True)  # a line with a user only: one event with a missing item (a reject)
    )
    return _with_row(lf), {USER_ID: USER_ID, ITEM_ID: ITEM_ID}, True, (USER_ID, ITEM_ID)  # no timestamp: line order


_READERS = {
    "parquet": _read_parquet,
    "ndjson": _read_ndjson,
    "movielens": _read_movielens,
    "sasrec": _read_sasrec,
    "s3rec": _read_s3rec,
}
