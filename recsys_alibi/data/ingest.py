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
  formats are read as strings; with ``data.id_type: auto`` an id column is integer when its
  first ``INFER_ROWS`` non-empty values all are integers without leading zeros (``int``/``str``
  force it); a value that does not parse as the chosen type is rejected (``bad_user_id``).
* timestamps: integers are seconds, or by ``data.timestamp_unit``; with ``auto`` a value above
  1e11 is milliseconds (above 1e14 microseconds, above 1e17 nanoseconds), decided per value;
  strings are integers or ISO-8601 (``2024-01-02``, ``2024-01-02 03:04:05``, ``...T...``,
  optional fraction, ``Z`` or ``+hh:mm``; naive times are UTC); datetimes are converted to UTC.
  Negative or unparseable timestamps are rejected (``bad_timestamp``).
* formats without timestamps (SASRec, S3-Rec, or ``data.columns.timestamp: null``) use the
  event's position in the input (``source_row``) as its time.
"""

from __future__ import annotations

import glob
import gzip
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from recsys_alibi.config import DataConfig
from recsys_alibi.data.schema import EVENT_TYPE, ITEM_ID, REJECT_REASON, SOURCE_ROW, TIMESTAMP, USER_ID, VALUE

FORMATS = ("parquet", "csv", "ndjson", "movielens", "sasrec", "s3rec")
CANONICAL = (USER_ID, ITEM_ID, TIMESTAMP, EVENT_TYPE, VALUE)
PREFIX = "_c_"  # canonical columns while the raw ones are still needed (rejects keep raw values)
INFER_ROWS = 1000  # rows sniffed to decide integer vs string ids in text formats
SNIFF_LINES = 200  # lines read to infer a text format

# reject reasons, checked in this order; the first that applies is recorded
MISSING_USER_ID = "missing_user_id"
BAD_USER_ID = "bad_user_id"
MISSING_ITEM_ID = "missing_item_id"
BAD_ITEM_ID = "bad_item_id"
BAD_TIMESTAMP = "bad_timestamp"
BAD_VALUE = "bad_value"
REJECT_REASONS = (MISSING_USER_ID, BAD_USER_ID, MISSING_ITEM_ID, BAD_ITEM_ID, BAD_TIMESTAMP, BAD_VALUE)

_FORMAT_HELP = "pass --format " + "|".join(FORMATS)


class DataError(ValueError):
    """A fatal input problem; the message is one line naming the problem and the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


@dataclass(frozen=True)
class Source:
    """A lazily scanned input.

    Attributes:
        frame: raw columns plus ``source_row`` Int64 (0-based position of the event in the input).
        fmt: the format it was read as.
        columns: canonical name -> raw column name (absent: not in this input).
        paths: the files read.
        text: True when every raw column was read as a string (text formats).
    """

    frame: pl.LazyFrame
    fmt: str
    columns: dict[str, str]
    paths: tuple[Path, ...]
    text: bool
    raw_columns: tuple[str, ...] = field(default=())


# ----------------------------------------------------------------------------- files and formats


def resolve_paths(input_path: str | Path) -> list[Path]:
    """The files behind a file, directory (all files below it, hidden ones skipped) or glob."""
    text = str(input_path)
    if any(ch in text for ch in "*?["):
        paths = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())
        if not paths:
            raise DataError(f"no files match '{text}'; check the pattern given as --input")
        return paths
    path = Path(text)
    if path.is_dir():
        paths = sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and not any(part.startswith((".", "_")) for part in p.relative_to(path).parts)
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
        return "csv"
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
    if "," in lines[0] or "\t" in lines[0]:
        return "csv"
    raise DataError(f"cannot infer the format of '{path}'; {_FORMAT_HELP}")


# ----------------------------------------------------------------------------- readers


def scan_source(cfg: DataConfig, input_path: str | Path, fmt: str | None = None) -> Source:
    """Scan the input lazily; nothing but a few sniffed lines is read here.

    Args:
        cfg: ``format``, ``columns``, ``separator``, ``has_header`` are used.
        input_path: a file, a directory, or a glob.
        fmt: overrides ``cfg.format``; ``None`` or ``"auto"`` infers it.

    Raises:
        DataError: missing input, unknown format, unreadable file, empty input, missing column.
    """
    paths = resolve_paths(input_path)
    fmt = fmt or cfg.format
    if fmt == "auto":
        fmt = infer_format(paths)
    if fmt not in FORMATS:
        raise DataError(f"unknown format '{fmt}'; {_FORMAT_HELP} (or auto)")
    reader = _READERS[fmt]
    try:
        frame, columns, text = reader(cfg, paths)
        schema = frame.collect_schema()
    except DataError:
        raise
    except (pl.exceptions.PolarsError, OSError, ValueError) as err:
        if isinstance(err, pl.exceptions.NoDataError):
            raise DataError(f"empty input: '{paths[0]}' has no rows; point --input at the event log") from None
        raise DataError(f"cannot read '{paths[0]}' as {fmt}: {_first_line(err)}; check the file or {_FORMAT_HELP}") from None
    raw = tuple(name for name in schema.names() if name != SOURCE_ROW)
    _check_columns(cfg, fmt, columns, raw)
    return Source(frame=frame, fmt=fmt, columns=columns, paths=tuple(paths), text=text, raw_columns=raw)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def _with_row(lf: pl.LazyFrame) -> pl.LazyFrame:
    return lf.with_row_index(SOURCE_ROW).with_columns(pl.col(SOURCE_ROW).cast(pl.Int64))


def _mapped(cfg: DataConfig) -> dict[str, str]:
    cols = cfg.columns
    mapping = {USER_ID: cols.user_id, ITEM_ID: cols.item_id}
    for canon, raw in ((TIMESTAMP, cols.timestamp), (EVENT_TYPE, cols.event_type), (VALUE, cols.value)):
        if raw is not None:
            mapping[canon] = raw
    return mapping


def _check_columns(cfg: DataConfig, fmt: str, columns: dict[str, str], raw: tuple[str, ...]) -> None:
    for canon, name in columns.items():
        if name not in raw:
            shown = ", ".join(raw[:12]) + (", ..." if len(raw) > 12 else "")
            fix = f"map it with --set data.columns.{canon}=NAME"
            if canon == TIMESTAMP:
                fix += " (or null to use the line order as time)"
            elif canon in (EVENT_TYPE, VALUE):
                fix += " (or null when the input has none)"
            raise DataError(f"column '{name}' (data.columns.{canon}) is not in the {fmt} input columns [{shown}]; {fix}")
    if cfg.min_value is not None and VALUE not in columns:
        raise DataError("data.min_value is set but the input has no value column; map one with --set data.columns.value=NAME")


def _read_parquet(cfg: DataConfig, paths: list[Path]) -> tuple[pl.LazyFrame, dict[str, str], bool]:
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
    return _with_row(lf), _mapped(cfg), False


def _separator(cfg: DataConfig, paths: list[Path]) -> str:
    if cfg.separator is not None:
        return cfg.separator
    name, _ = _stem_suffix(paths[0])
    if name.endswith(".tsv"):
        return "\t"
    first = _head_bytes(paths[0], 4096).decode("utf-8", "replace").split("\n", 1)[0]
    return "\t" if "\t" in first and "," not in first else ","


def _read_csv(cfg: DataConfig, paths: list[Path]) -> tuple[pl.LazyFrame, dict[str, str], bool]:
    lf = pl.scan_csv(
        paths,
        separator=_separator(cfg, paths),
        has_header=cfg.has_header,
        infer_schema=False,  # every column as String: bad values become rejects, not read errors
        truncate_ragged_lines=True,
        raise_if_empty=True,
    )
    if not cfg.has_header:  # name columns column_1, column_2, ... whatever the polars version
        names = lf.collect_schema().names()
        lf = lf.rename({old: f"column_{i}" for i, old in enumerate(names, start=1)})
    return _with_row(lf), _mapped(cfg), True


def _read_ndjson(cfg: DataConfig, paths: list[Path]) -> tuple[pl.LazyFrame, dict[str, str], bool]:
    lf = pl.scan_ndjson(paths, infer_schema_length=INFER_ROWS)
    return _with_row(lf), _mapped(cfg), False


def _positional(paths: list[Path], separator: str, names: list[str]) -> pl.LazyFrame:
    """A headerless delimited text file whose columns are known by position."""
    lf = pl.scan_csv(
        paths,
        separator=separator,
        has_header=False,
        infer_schema=False,
        quote_char=None,
        truncate_ragged_lines=True,
        raise_if_empty=True,
    )
    raw = lf.collect_schema().names()
    picked = [pl.col(raw[i]).alias(name) if i < len(raw) else pl.lit(None, pl.String).alias(name) for i, name in names]
    return lf.select(picked)


def _read_movielens(cfg: DataConfig, paths: list[Path]) -> tuple[pl.LazyFrame, dict[str, str], bool]:
    """``ratings.dat`` (``u::i::r::t``: read with ':' as separator, fields 0, 2, 4, 6) or tab ``u.data``."""
    head = _head_bytes(paths[0], 4096).decode("utf-8", "replace")
    names = [USER_ID, ITEM_ID, VALUE, TIMESTAMP]
    if "::" in head:
        lf = _positional(paths, ":", list(zip((0, 2, 4, 6), names)))
    else:
        lf = _positional(paths, "\t", list(enumerate(names)))
    return _with_row(lf), {n: n for n in names}, True


def _read_sasrec(cfg: DataConfig, paths: list[Path]) -> tuple[pl.LazyFrame, dict[str, str], bool]:
    """``user item`` per line, each user's lines in time order; the line order is the time."""
    head = _head_bytes(paths[0], 4096).decode("utf-8", "replace")
    sep = "\t" if "\t" in head.split("\n", 1)[0] else " "
    lf = _positional(paths, sep, [(0, USER_ID), (1, ITEM_ID)])
    return _with_row(lf), {USER_ID: USER_ID, ITEM_ID: ITEM_ID}, True  # no timestamp: line order


def _read_s3rec(cfg: DataConfig, paths: list[Path]) -> tuple[pl.LazyFrame, dict[str, str], bool]:
    """``user item item ...`` per line in time order; one event per item, the event order is the time."""
    tokens = pl.col("line").str.replace_all(r"\s+", " ").str.strip_chars().str.split(" ")
    lf = (
        pl.scan_lines(paths)
        .filter(pl.col("line").str.strip_chars() != "")
        .select(tokens.list.first().alias(USER_ID), tokens.list.slice(1).alias(ITEM_ID))
        .explode(ITEM_ID)  # a line with a user only gives one event with a missing item
    )
    return _with_row(lf), {USER_ID: USER_ID, ITEM_ID: ITEM_ID}, True  # no timestamp: line order


_READERS = {
    "parquet": _read_parquet,
    "csv": _read_csv,
    "ndjson": _read_ndjson,
    "movielens": _read_movielens,
    "sasrec": _read_sasrec,
    "s3rec": _read_s3rec,
}


# ----------------------------------------------------------------------------- canonical columns


def _looks_integer(source: Source, raw: str) -> bool:
    """Whether the first INFER_ROWS non-empty values of a text column are all integers."""
    sample = (
        source.frame.select(pl.col(raw).str.strip_chars())
        .filter(pl.col(raw).is_not_null() & (pl.col(raw) != ""))
        .head(INFER_ROWS)
        .collect()
        .to_series()
    )
    return sample.len() > 0 and bool(sample.str.contains(r"^-?(0|[1-9]\d*)$").all())


def _id_expr(source: Source, raw: str, dtype: pl.DataType, id_type: str) -> tuple[pl.Expr, pl.Expr]:
    """(canonical id, is-missing) for one id column; an unparseable id gives a null id."""
    col = pl.col(raw)
    if isinstance(dtype, (pl.Categorical, pl.Enum)):
        col, dtype = col.cast(pl.String), pl.String
    if dtype == pl.String:
        stripped = col.str.strip_chars()
        missing = stripped.is_null() | (stripped == "")
        if source.text and (id_type == "int" or (id_type == "auto" and _looks_integer(source, raw))):
            return stripped.cast(pl.Int64, strict=False), missing
        return stripped if source.text else col, missing
    if dtype.is_integer():
        return col.cast(pl.Int64, strict=False), col.is_null()
    if dtype.is_float():
        ok = col.is_finite() & (col == col.floor())
        return pl.when(ok).then(col.cast(pl.Int64, strict=False)), col.is_null() | col.is_nan()
    if dtype == pl.Null:
        return col.cast(pl.Int64), col.is_null()
    raise DataError(f"id column '{raw}' has type {dtype}; ids must be integers or strings, map another column with data.columns")


def _epoch_from_number(x: pl.Expr, unit: str) -> pl.Expr:
    """Integer seconds/ms/us/ns -> seconds (floor division; negative values are kept, then rejected)."""
    if unit == "s":
        return x
    if unit == "ms":
        return x // 1000
    return (
        pl.when(x > 100_000_000_000_000_000)
        .then(x // 1_000_000_000)
        .when(x > 100_000_000_000_000)
        .then(x // 1_000_000)
        .when(x > 100_000_000_000)
        .then(x // 1000)
        .otherwise(x)
    )


def _epoch_from_string(col: pl.Expr, unit: str) -> pl.Expr:
    s = col.str.strip_chars()
    as_int = s.cast(pl.Int64, strict=False)
    as_float = s.cast(pl.Float64, strict=False)
    iso = s.str.replace(r"[zZ]$", "+00:00").str.replace(r"^(\d{4}-\d\d-\d\d)[ T]", "${1}T")
    parsed = pl.coalesce(
        iso.str.to_datetime("%Y-%m-%dT%H:%M:%S%.f%:z", strict=False, time_zone="UTC", time_unit="us").dt.epoch("s"),
        iso.str.to_datetime("%Y-%m-%dT%H:%M:%S%.f", strict=False, time_unit="us").dt.epoch("s"),
        iso.str.to_datetime("%Y-%m-%dT%H:%M%:z", strict=False, time_zone="UTC", time_unit="us").dt.epoch("s"),
        iso.str.to_datetime("%Y-%m-%dT%H:%M", strict=False, time_unit="us").dt.epoch("s"),
        iso.str.to_date("%Y-%m-%d", strict=False).cast(pl.Datetime("us")).dt.epoch("s"),
    )
    number = pl.coalesce(as_int, pl.when(as_float.is_finite()).then(as_float.floor().cast(pl.Int64, strict=False)))
    return pl.when(number.is_not_null()).then(_epoch_from_number(number, unit)).otherwise(parsed)


def _timestamp_expr(raw: str, dtype: pl.DataType, unit: str) -> pl.Expr:
    col = pl.col(raw)
    if dtype == pl.String:
        return _epoch_from_string(col, unit)
    if dtype.is_integer():
        return _epoch_from_number(col.cast(pl.Int64, strict=False), unit)
    if dtype.is_float():
        ok = col.is_finite()
        return _epoch_from_number(pl.when(ok).then(col.floor().cast(pl.Int64, strict=False)), unit)
    if isinstance(dtype, pl.Datetime):
        return col.dt.epoch("s")  # the physical value is UTC whether or not a zone is attached
    if dtype == pl.Date:
        return col.cast(pl.Datetime("us")).dt.epoch("s")
    if dtype == pl.Null:
        return col.cast(pl.Int64)
    raise DataError(f"timestamp column '{raw}' has type {dtype}; map a column of integers, ISO-8601 strings or datetimes")


def _value_expr(raw: str, dtype: pl.DataType) -> pl.Expr:
    col = pl.col(raw)
    number = col.str.strip_chars().cast(pl.Float64, strict=False) if dtype == pl.String else col.cast(pl.Float64, strict=False)
    return pl.when(number.is_finite()).then(number).cast(pl.Float32)


def tag_rows(source: Source, cfg: DataConfig) -> pl.LazyFrame:
    """Add ``_c_``-prefixed canonical columns and ``reject_reason`` (null for a good row).

    Returns:
        The raw columns, ``source_row``, ``_c_user_id``, ``_c_item_id``, ``_c_timestamp`` Int64
        (line order when the input has no time), ``_c_event_type`` String and ``_c_value``
        Float32 (when mapped), and ``reject_reason`` String.
    """
    schema = source.frame.collect_schema()
    cols = source.columns
    user, user_missing = _id_expr(source, cols[USER_ID], schema[cols[USER_ID]], cfg.id_type)
    item, item_missing = _id_expr(source, cols[ITEM_ID], schema[cols[ITEM_ID]], cfg.id_type)
    exprs = [user.alias(PREFIX + USER_ID), item.alias(PREFIX + ITEM_ID)]
    if TIMESTAMP in cols:
        ts = _timestamp_expr(cols[TIMESTAMP], schema[cols[TIMESTAMP]], cfg.timestamp_unit)
    else:
        ts = pl.col(SOURCE_ROW)
    exprs.append(ts.alias(PREFIX + TIMESTAMP))
    if EVENT_TYPE in cols:
        exprs.append(pl.col(cols[EVENT_TYPE]).cast(pl.String).alias(PREFIX + EVENT_TYPE))
    if VALUE in cols:
        exprs.append(_value_expr(cols[VALUE], schema[cols[VALUE]]).alias(PREFIX + VALUE))

    c = lambda name: pl.col(PREFIX + name)  # noqa: E731
    reason = (
        pl.when(user_missing)
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
    """The canonical columns present in a tagged frame, in schema order."""
    names = set(tagged.collect_schema().names())
    return [name for name in CANONICAL if PREFIX + name in names]


def valid_events(tagged: pl.LazyFrame) -> pl.LazyFrame:
    """Good rows as canonical events plus ``source_row``."""
    cols = canonical_columns(tagged)
    return tagged.filter(pl.col(REJECT_REASON).is_null()).select(
        *[pl.col(PREFIX + name).alias(name) for name in cols], pl.col(SOURCE_ROW)
    )


def rejected_rows(tagged: pl.LazyFrame, raw_columns: tuple[str, ...]) -> pl.LazyFrame:
    """Rejected rows with their raw values, ``source_row`` and ``reject_reason``."""
    return tagged.filter(pl.col(REJECT_REASON).is_not_null()).select(*raw_columns, SOURCE_ROW, REJECT_REASON)
