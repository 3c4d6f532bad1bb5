"""Read any supported event log lazily and map it onto the canonical event schema.

Two steps, both lazy:

* :func:`scan_source` finds the files, infers the format and returns a :class:`Source`: a
  ``LazyFrame`` of the raw columns plus ``source_row`` (the row's position in the input), and
  which raw column feeds each canonical column.
* :func:`tag_rows` adds the canonical columns (``user_id``, ``item_id``, ``timestamp``,
  ``event_type``, ``value`` under the internal prefix ``_c_``) and ``reject_reason`` (null for a
  good row). :func:`valid_events` and :func:`rejected_rows` split the tagged frame.

Rules (docs/data.md has the full table):

* ids keep their source type: integer columns become Int64, string columns stay String. Text
  ids (and NDJSON ids that are numbers) are read as text; with ``data.id_type: auto`` a column
  becomes Int64 only when EVERY kept value round-trips exactly (``str(int(x)) == x``: no
  ``007``, ``+7``, ``-0``), decided over all rows by :func:`integer_id_columns` after reading;
  otherwise it stays String, so two spellings never merge. ``int``/``str`` force it (``int``:
  a value that is not an integer is rejected as ``bad_user_id`` / ``bad_item_id``).
* timestamps (:mod:`recsys_alibi.data.timestamps`): seconds plus the nanoseconds within the
  second (``schema.SUBSECOND``), so ``prepare`` sorts and de-duplicates at full precision.
  Negative or unparseable timestamps are rejected (``bad_timestamp``).
* a CSV row with more or fewer fields than the header, or a MovieLens / SASRec line with the
  wrong number of fields, is rejected (``bad_field_count``), never kept with fields dropped.
* several files are read in natural name order (``day9`` before ``day10``), see
  :func:`resolve_paths`.
* formats without timestamps (SASRec, S3-Rec, or ``data.columns.timestamp: null``) use the
  event's position in the input (``source_row``) as its time.
"""

from __future__ import annotations

import glob
import gzip
import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from recsys_alibi.config import DataConfig
from recsys_alibi.data.errors import DataError, first_line, read_error
from recsys_alibi.data.ids import cast_integer_ids, id_expr, integer_id_columns
from recsys_alibi.data.schema import (
    EVENT_TYPE,
    ITEM_ID,
    REJECT_REASON,
    SOURCE_ROW,
    SUBSECOND,
    TIMESTAMP,
    USER_ID,
    VALUE,
)
from recsys_alibi.data.timestamps import has_subseconds, timestamp_parts

__all__ = [
    "DataError", "Source", "canonical_events", "cast_integer_ids", "integer_id_columns", "resolve_paths", "scan_source",
    "tag_rows", "valid_events",
]  # fmt: skip

FORMATS = ("parquet", "csv", "ndjson", "movielens", "sasrec", "s3rec")
CANONICAL = (USER_ID, ITEM_ID, TIMESTAMP, EVENT_TYPE, VALUE)
PREFIX = "_c_"  # canonical columns while the raw ones are still needed (rejects keep raw values)
FIELDS_OK = "_fields_ok"  # internal: False for a line/row with the wrong number of fields
INFER_ROWS = 1000  # NDJSON lines read to infer the column types (mapped columns are then read as text)
SNIFF_LINES = 200  # lines read to infer a text format
MOVIELENS_CSV_HEADER = "userid,movieid,rating,timestamp"  # GroupLens ml-latest / ml-20m / ml-25m / ml-32m ratings.csv
SEPARATORS = (",", "\t", ";", "|")  # CSV separators recognised in a header line, in this order

# reject reasons, checked in this order; the first that applies is recorded
BAD_FIELD_COUNT = "bad_field_count"
MISSING_USER_ID = "missing_user_id"
BAD_USER_ID = "bad_user_id"
MISSING_ITEM_ID = "missing_item_id"
BAD_ITEM_ID = "bad_item_id"
BAD_TIMESTAMP = "bad_timestamp"
BAD_VALUE = "bad_value"
REJECT_REASONS = (BAD_FIELD_COUNT, MISSING_USER_ID, BAD_USER_ID, MISSING_ITEM_ID, BAD_ITEM_ID, BAD_TIMESTAMP, BAD_VALUE)

_FORMAT_HELP = "pass --format " + "|".join(FORMATS)
_first_line = first_line  # kept for the modules that import it from here


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
    """

    frame: pl.LazyFrame
    fmt: str
    columns: dict[str, str]
    paths: tuple[Path, ...]
    text: bool
    raw_columns: tuple[str, ...] = field(default=())
    text_ids: tuple[str, ...] = field(default=())


class QuotedLinesError(DataError):
    """A CSV record spans several lines (a quoted newline): its fields cannot be counted per line."""


# ----------------------------------------------------------------------------- files and formats


def natural_key(path: Path) -> tuple:
    """Sort key comparing the numbers in a path as numbers: ``day9`` < ``day10`` < ``day11``.

    Each path part is split into text and digit runs; ties (``day01`` vs ``day1``) fall back to
    the plain text, so the order is total and does not depend on the listing order.
    """
    parts = tuple(
        tuple(int(tok) if i % 2 else tok for i, tok in enumerate(re.split(r"(\d+)", part))) for part in path.parts
    )
    return parts, str(path)


def resolve_paths(input_path: str | Path) -> list[Path]:
    """The files behind a file, directory (all files below it, hidden ones skipped) or glob.

    Several files are returned in natural order (:func:`natural_key`: ``day9, day10, day11``),
    which is also the order their lines are read in, so line-order time follows it.
    """
    text = str(input_path)
    if any(ch in text for ch in "*?["):
        paths = sorted((Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file()), key=natural_key)
        if not paths:
            raise DataError(f"no files match '{text}'; check the pattern given as --input")
        return paths
    path = Path(text)
    if path.is_dir():
        paths = sorted(
            (
                p
                for p in path.rglob("*")
                if p.is_file() and not any(part.startswith((".", "_")) for part in p.relative_to(path).parts)
            ),
            key=natural_key,
        )
        if not paths:
            raise DataError(f"empty input: directory '{path}' holds no files; point --input at the event log")
        return paths
    if not path.is_file():
        raise DataError(f"input not found: '{path}'; pass an existing file, directory or glob as --input")
    return [path]


def _stem_suffix(path: Path) -> tuple[str, bool]:
    """The name without ``.gz`` (lower case) and whether it was gzip-compressed."""
    name = path.name.lower()
    return (name[:-3], True) if name.endswith(".gz") else (name, False)


def _head_bytes(path: Path, n: int = 1 << 16) -> bytes:
    opener = gzip.open if _stem_suffix(path)[1] else open
    try:
        with opener(path, "rb") as fh:
            return fh.read(n)
    except OSError as err:  # bad gzip, permissions
        raise DataError(f"cannot read '{path}': {_first_line(err)}; check the file") from None


def infer_format(paths: list[Path]) -> str:
    """Guess the format from the first file's name, then from its first lines."""
    path = paths[0]
    name, _ = _stem_suffix(path)
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".csv", ".tsv")):
        return "movielens" if _is_movielens_csv(_head_bytes(path, 256).decode("utf-8", "replace")) else "csv"
    if name.endswith((".ndjson", ".jsonl", ".json")):
        return "ndjson"
    if name.endswith(".dat") or name == "u.data":
        return "movielens"
    head = _head_bytes(path)
    if head.startswith(b"PAR1"):
        return "parquet"
    lines = [ln.strip() for ln in head.decode("utf-8", "replace").splitlines()[:SNIFF_LINES]]
    lines = [ln for ln in lines if ln]
    if len(head) == 1 << 16 and len(lines) > 1:
        lines = lines[:-1]  # the last line may be cut
    if not lines:
        raise DataError(f"empty input: '{path}' has no lines; point --input at the event log")
    if lines[0].startswith("{"):
        return "ndjson"
    if "::" in lines[0]:
        return "movielens"
    widths = {len(ln.split()) for ln in lines}
    numeric = all(tok.lstrip("-").isdigit() for ln in lines for tok in ln.split())
    if numeric and "\t" in lines[0] and widths == {4}:
        return "movielens"  # u.data: user item rating timestamp
    if numeric and widths == {2}:
        return "sasrec"
    if numeric and min(widths) >= 2 and "," not in lines[0]:
        return "s3rec"
    if _header_separator(lines[0]) is not None:
        return "csv"
    raise DataError(f"cannot infer the format of '{path}'; {_FORMAT_HELP}")


# ----------------------------------------------------------------------------- readers

Read = tuple[pl.LazyFrame, dict[str, str], bool, tuple[str, ...]]  # frame, columns, text, text ids


def scan_source(cfg: DataConfig, input_path: str | Path, fmt: str | None = None, *, count_fields: bool = True) -> Source:
    """Scan the input lazily; nothing but a few sniffed lines is read here.

    Args:
        cfg: ``format``, ``columns``, ``separator``, ``has_header``, ``id_type`` are used.
        input_path: a file, a directory, or a glob.
        fmt: overrides ``cfg.format``; ``None`` or ``"auto"`` infers it.
        count_fields: check each CSV row's number of fields against the header (off only for
            a CSV whose quoted fields span lines, see :class:`QuotedLinesError`).

    Raises:
        DataError: missing input, unknown format, unreadable file (naming the file, and the line
            or byte where it can), empty input, missing column.
    """
    paths = resolve_paths(input_path)
    fmt = fmt or cfg.format
    if fmt == "auto":
        fmt = infer_format(paths)
    if fmt not in FORMATS:
        raise DataError(f"unknown format '{fmt}'; {_FORMAT_HELP} (or auto)")
    try:
        if fmt == "csv":
            frame, columns, text, text_ids = _read_csv(cfg, paths, count_fields)
        else:
            frame, columns, text, text_ids = _READERS[fmt](cfg, paths)
        schema = frame.collect_schema()
    except DataError:
        raise
    except (pl.exceptions.PolarsError, OSError, ValueError) as err:
        if isinstance(err, pl.exceptions.NoDataError):
            raise DataError(f"empty input: '{paths[0]}' has no rows; point --input at the event log") from None
        raise read_error(paths, fmt, err, f"check the file or {_FORMAT_HELP}") from None
    raw = tuple(name for name in schema.names() if name not in (SOURCE_ROW, FIELDS_OK))
    if text and any("\ufffd" in name for name in raw):  # polars replaced bytes of a non-UTF-8 header
        raise read_error(paths, fmt, ValueError("the header is not UTF-8"), "convert the file to UTF-8")
    _check_columns(cfg, fmt, columns, raw)
    if text and cfg.id_type != "auto":
        text_ids = ()
    return Source(frame=frame, fmt=fmt, columns=columns, paths=tuple(paths), text=text, raw_columns=raw, text_ids=text_ids)


def _with_row(lf: pl.LazyFrame) -> pl.LazyFrame:
    return lf.with_row_index(SOURCE_ROW).with_columns(pl.col(SOURCE_ROW).cast(pl.Int64))


def _mapped(cfg: DataConfig) -> dict[str, str]:
    cols = cfg.columns
    mapping = {USER_ID: cols.user_id, ITEM_ID: cols.item_id}
    for canon, raw in ((TIMESTAMP, cols.timestamp), (EVENT_TYPE, cols.event_type), (VALUE, cols.value)):
        if raw is not None:
            mapping[canon] = raw
    return mapping


def _header_separator(line: str) -> str | None:
    """The first of ``SEPARATORS`` found in a header line, or None."""
    return next((sep for sep in SEPARATORS if sep in line), None)


def _check_columns(cfg: DataConfig, fmt: str, columns: dict[str, str], raw: tuple[str, ...]) -> None:
    for canon, name in columns.items():
        if name not in raw:
            shown = ", ".join(raw[:12]) + (", ..." if len(raw) > 12 else "")
            fix = f"map it with --set data.columns.{canon}=NAME"
            if canon == TIMESTAMP:
                fix += " (or null to use the line order as time)"
            elif canon in (EVENT_TYPE, VALUE):
                fix += " (or null when the input has none)"
            other = _header_separator(raw[0]) if fmt == "csv" and len(raw) == 1 else None
            if other is not None:  # the header was not split: another separator
                fix = f"the header looks '{other}'-separated: set --set data.separator='{other}', or {fix}"
            raise DataError(f"column '{name}' (data.columns.{canon}) is not in the {fmt} input columns [{shown}]; {fix}")
    if cfg.min_value is not None and VALUE not in columns:
        raise DataError("data.min_value is set but the input has no value column; map one with --set data.columns.value=NAME")


def _read_parquet(cfg: DataConfig, paths: list[Path]) -> Read:
    plain = [p for p in paths if not _stem_suffix(p)[1]]
    if len(plain) == len(paths):
        lf = pl.scan_parquet(paths, hive_partitioning=False)
    else:  # Parquet compresses inside; a gzipped Parquet file is read whole into memory
        frames = []
        for p in paths:
            if _stem_suffix(p)[1]:
                with gzip.open(p, "rb") as fh:
                    frames.append(pl.read_parquet(fh.read()).lazy())
            else:
                frames.append(pl.scan_parquet(p))
        lf = pl.concat(frames, how="vertical")
    return _with_row(lf), _mapped(cfg), False, ()


def _separator(cfg: DataConfig, paths: list[Path]) -> str:
    """``data.separator``; else tab for ``.tsv``; else the first of ``SEPARATORS`` in the header line."""
    if cfg.separator is not None:
        return cfg.separator
    name, _ = _stem_suffix(paths[0])
    if name.endswith(".tsv"):
        return "\t"
    first = _head_bytes(paths[0], 4096).decode("utf-8", "replace").split("\n", 1)[0]
    return _header_separator(first) or ","


def _field_counts(paths: list[Path], separator: str, skip_header: bool) -> pl.LazyFrame:
    """(rows,) Int64 ``_fields``: fields per line of the files (quoted separators not counted)."""
    frames = [pl.scan_lines(p).slice(1) if skip_header else pl.scan_lines(p) for p in paths]
    line = pl.col("line").str.replace_all(r'"[^"]*"', "")
    return pl.concat(frames, how="vertical").select(line.str.count_matches(separator, literal=True).alias("_fields") + 1)


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
        truncate_ragged_lines=True,
        raise_if_empty=True,
    )
    names = lf.collect_schema().names()
    if not cfg.has_header:  # name columns column_1, column_2, ... whatever the polars version
        lf = lf.rename({old: f"column_{i}" for i, old in enumerate(names, start=1)})
    if count_fields:
        counts = _field_counts(paths, separator, cfg.has_header)
        lf = pl.concat([lf, counts], how="horizontal").select(
            pl.exclude("_fields"), (pl.col("_fields") == len(names)).alias(FIELDS_OK)
        )
    return _with_row(lf), _mapped(cfg), True, (USER_ID, ITEM_ID)


def _read_ndjson(cfg: DataConfig, paths: list[Path]) -> Read:
    """One JSON object per line; only the mapped fields are read, as text, so a late type change is no error.

    The fields and their types are inferred from the first ``INFER_ROWS`` lines (a mapped field
    absent there is reported missing); then only the mapped fields are read, each as String (a
    JSON number as its text), so a string timestamp or id after those lines, or an unmapped
    field that changes type, is parsed like any other line. Id fields that were numbers there
    are typed later by :func:`integer_id_columns` (Int64 when every value round-trips); string
    ids stay strings. A rejects file holds the mapped fields only.
    """
    inferred = pl.scan_ndjson(paths, infer_schema_length=INFER_ROWS).collect_schema()
    mapped = _mapped(cfg)
    schema = {raw: inferred[raw] if inferred[raw].is_nested() else pl.String for raw in mapped.values() if raw in inferred}
    lf = pl.scan_ndjson(paths, schema=schema) if schema else pl.scan_ndjson(paths, infer_schema_length=INFER_ROWS)
    numbers = {raw for raw in schema if not inferred[raw].is_nested() and inferred[raw] != pl.String}
    text_ids = tuple(c for c in (USER_ID, ITEM_ID) if mapped[c] in numbers)
    return _with_row(lf), mapped, False, text_ids


def _split_lines(
    paths: list[Path], pattern: str, names: list[tuple[int, str]], fields: int, skip: str | None = None
) -> pl.LazyFrame:
    """A text file whose fields are separated by the regex ``pattern``, known by position.

    Blank lines are skipped, and so are lines equal to ``skip`` ignoring case (a header);
    ``_fields_ok`` is False for a line with other than ``fields`` fields.
    """
    line = pl.col("line").str.strip_chars()
    parts = line.str.replace_all(pattern, "\x1f").str.split("\x1f")  # a regex split: mark, then split
    keep = (line != "") if skip is None else (line != "") & (line.str.to_lowercase() != skip)
    lf = pl.scan_lines(paths).filter(keep).select(parts.alias("_parts"))
    picked = [pl.col("_parts").list.get(i, null_on_oob=True).alias(name) for i, name in names]
    return lf.select(*picked, (pl.col("_parts").list.len() == fields).alias(FIELDS_OK))


def _is_movielens_csv(head: str) -> bool:
    """Whether a file's first line is the GroupLens ``ratings.csv`` header (any case)."""
    lines = head.splitlines()
    return bool(lines) and lines[0].strip().lower() == MOVIELENS_CSV_HEADER


def _read_movielens(cfg: DataConfig, paths: list[Path]) -> Read:
    """``ratings.dat`` (``u::i::r::t``), tab-separated ``u.data`` or GroupLens ``ratings.csv``
    (header ``userId,movieId,rating,timestamp``, skipped): four fields per line."""
    head = _head_bytes(paths[0], 4096).decode("utf-8", "replace")
    names = [USER_ID, ITEM_ID, VALUE, TIMESTAMP]
    separator = "::" if "::" in head else "," if _is_movielens_csv(head) else "\t"
    lf = _split_lines(paths, separator, list(enumerate(names)), 4, skip=MOVIELENS_CSV_HEADER)
    return _with_row(lf), {n: n for n in names}, True, (USER_ID, ITEM_ID)


def _read_sasrec(cfg: DataConfig, paths: list[Path]) -> Read:
    """``user item`` per line (spaces or tabs), each user's lines in time order; the line order is the time."""
    lf = _split_lines(paths, r"\s+", [(0, USER_ID), (1, ITEM_ID)], 2)
    return _with_row(lf), {USER_ID: USER_ID, ITEM_ID: ITEM_ID}, True, (USER_ID, ITEM_ID)  # no timestamp: line order


def _read_s3rec(cfg: DataConfig, paths: list[Path]) -> Read:
    """``user item item ...`` per line in time order; one event per item, the event order is the time."""
    tokens = pl.col("line").str.replace_all(r"\s+", " ").str.strip_chars().str.split(" ")
    lf = (
        pl.scan_lines(paths)
        .filter(pl.col("line").str.strip_chars() != "")
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


# ----------------------------------------------------------------------------- canonical columns


def _value_expr(raw: str, dtype: pl.DataType) -> pl.Expr:
    col = pl.col(raw)
    number = col.str.strip_chars().cast(pl.Float64, strict=False) if dtype == pl.String else col.cast(pl.Float64, strict=False)
    return pl.when(number.is_finite()).then(number).cast(pl.Float32)


def tag_rows(source: Source, cfg: DataConfig) -> pl.LazyFrame:
    """Add ``_c_``-prefixed canonical columns and ``reject_reason`` (null for a good row).

    Returns:
        The raw columns, ``source_row``, ``_c_user_id``, ``_c_item_id`` (ids in
        ``source.text_ids`` as String, typed later by :func:`integer_id_columns`),
        ``_c_timestamp`` Int64 seconds (line order when the input has no time), ``_c__subsecond``
        Int32 ns within the second (when the source can have them), ``_c_event_type`` String and
        ``_c_value`` Float32 (when mapped), and ``reject_reason`` String.

    Raises:
        DataError: an id or timestamp column of an unsupported type.
    """
    schema = source.frame.collect_schema()
    cols = source.columns
    user, user_missing = id_expr(cols[USER_ID], schema[cols[USER_ID]], source.text, cfg.id_type)
    item, item_missing = id_expr(cols[ITEM_ID], schema[cols[ITEM_ID]], source.text, cfg.id_type)
    exprs = [user.alias(PREFIX + USER_ID), item.alias(PREFIX + ITEM_ID)]
    if TIMESTAMP in cols:
        raw, dtype = cols[TIMESTAMP], schema[cols[TIMESTAMP]]
        try:
            seconds, ns = timestamp_parts(raw, dtype, cfg.timestamp_unit)
        except TypeError:
            raise DataError(
                f"timestamp column '{raw}' has type {dtype}; map a column of integers, ISO-8601 strings or datetimes"
            ) from None
        exprs.append(seconds.alias(PREFIX + TIMESTAMP))
        if has_subseconds(dtype, cfg.timestamp_unit):
            exprs.append(ns.cast(pl.Int32).alias(PREFIX + SUBSECOND))  # < 1e9: 4 bytes per event
    else:
        exprs.append(pl.col(SOURCE_ROW).alias(PREFIX + TIMESTAMP))
    if EVENT_TYPE in cols:
        exprs.append(pl.col(cols[EVENT_TYPE]).cast(pl.String).alias(PREFIX + EVENT_TYPE))
    if VALUE in cols:
        exprs.append(_value_expr(cols[VALUE], schema[cols[VALUE]]).alias(PREFIX + VALUE))

    c = lambda name: pl.col(PREFIX + name)  # noqa: E731
    reason = pl.when(pl.col(FIELDS_OK).not_()).then(pl.lit(BAD_FIELD_COUNT)) if FIELDS_OK in schema else pl
    reason = (
        reason.when(user_missing)
        .then(pl.lit(MISSING_USER_ID))
        .when(c(USER_ID).is_null())
        .then(pl.lit(BAD_USER_ID))
        .when(item_missing)
        .then(pl.lit(MISSING_ITEM_ID))
        .when(c(ITEM_ID).is_null())
        .then(pl.lit(BAD_ITEM_ID))
        .when(c(TIMESTAMP).is_null() | (c(TIMESTAMP) < 0))
        .then(pl.lit(BAD_TIMESTAMP))
    )
    if VALUE in cols:
        reason = reason.when(c(VALUE).is_null()).then(pl.lit(BAD_VALUE))
    reason = reason.otherwise(pl.lit(None, pl.String))
    # user/item "missing" conditions read raw columns, so they are evaluated in a second step
    return source.frame.with_columns(exprs).with_columns(reason.alias(REJECT_REASON))


def canonical_columns(tagged: pl.LazyFrame) -> list[str]:
    """The canonical columns present in a tagged frame, in schema order (plus ``_subsecond``)."""
    names = set(tagged.collect_schema().names())
    return [name for name in (*CANONICAL, SUBSECOND) if PREFIX + name in names]


def valid_events(tagged: pl.LazyFrame) -> pl.LazyFrame:
    """Good rows as canonical events plus ``source_row`` (and ``_subsecond`` when present).

    Ids of ``Source.text_ids`` are still text: :func:`canonical_events` types them.
    """
    cols = canonical_columns(tagged)
    return tagged.filter(pl.col(REJECT_REASON).is_null()).select(
        *[pl.col(PREFIX + name).alias(name) for name in cols], pl.col(SOURCE_ROW)
    )


def canonical_events(source: Source, cfg: DataConfig) -> pl.LazyFrame:
    """Good rows with their final id types (one extra pass when ids were read as text).

    ``prepare`` does the same in its own passes; this is the plain path (tests, small inputs).
    """
    events = valid_events(tag_rows(source, cfg))
    return cast_integer_ids(events, integer_id_columns(events, source.text_ids))


def rejected_rows(tagged: pl.LazyFrame, raw_columns: tuple[str, ...]) -> pl.LazyFrame:
    """Rejected rows with their raw values, ``source_row`` and ``reject_reason``."""
    return tagged.filter(pl.col(REJECT_REASON).is_not_null()).select(*raw_columns, SOURCE_ROW, REJECT_REASON)
