"""Map a scanned input onto the canonical event schema and tag each row good or rejected.

Reading is lazy and in two modules: :mod:`recsys_alibi.data.formats` (which files, which format)
and :mod:`recsys_alibi.data.readers` (:func:`scan_source`: a :class:`Source` of raw columns
plus ``source_row``). Here, also lazily:

* :func:`tag_rows` adds the canonical columns (``user_id``, ``item_id``, ``timestamp``,
  ``event_type``, ``value`` under the internal prefix ``_c_``) and ``reject_reason`` (null for a
  good row). :func:`valid_events` and :func:`rejected_rows` split the tagged frame.

Rules (docs/data.md has the full table):

* ids keep their source type: integer columns become Int64, string columns stay String. Text
  ids (and NDJSON ids that are numbers) are read as text; with ``data.id_type: auto`` a column
  becomes Int64 only when EVERY kept value round-trips exactly (``str(int(x)) == x``: no
  ``007``, ``+7``, ``-0``), decided over all rows by :func:`integer_id_columns` after reading;
  otherwise it stays String, so two spellings never merge. ``int``/``str`` force it (``int``:
  a value that is not an integer is rejected as ``bad_user_id`` / ``bad_item_id``). An NDJSON id
  that is an object, an array, true or false is rejected the same way (``readers.SCALAR_ID``).
* timestamps (:mod:`recsys_alibi.data.timestamps`): seconds plus the nanoseconds within the
  second (``schema.SUBSECOND``), so ``prepare`` sorts and de-duplicates at full precision.
  Negative or unparseable timestamps are rejected (``bad_timestamp``), and so are times more than a day after the
  prepare's clock (``future_timestamp``).
* a CSV row with more or fewer fields than the header, or a MovieLens / SASRec line with the
  wrong number of fields, is rejected (``bad_field_count``), never kept with fields dropped.
* several files are read in natural name order (``day9`` before ``day10``), see
  :func:`resolve_paths`.
* formats without timestamps (SASRec, S3-Rec, or ``data.columns.timestamp: null``) use the
  event's position in the input (``source_row``) as its time.
"""

from __future__ import annotations

import time

import polars as pl

from recsys_alibi.config import DataConfig
from recsys_alibi.data.errors import DataError
from recsys_alibi.data.formats import infer_format, resolve_paths
from recsys_alibi.data.ids import cast_integer_ids, id_expr, integer_id_columns
from recsys_alibi.data.readers import FIELDS_OK, RESERVED_PREFIX, SCALAR_ID, QuotedLinesError, Source, scan_source
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
from recsys_alibi.data.timestamps import has_subseconds, timestamp_parts, usable_seconds

__all__ = [
    "DataError", "QuotedLinesError", "Source", "canonical_events", "cast_integer_ids", "infer_format",
    "integer_id_columns", "rejected_rows", "resolve_paths", "scan_source", "tag_rows", "valid_events",
]  # fmt: skip

CANONICAL = (USER_ID, ITEM_ID, TIMESTAMP, EVENT_TYPE, VALUE)
PREFIX = RESERVED_PREFIX  # canonical columns while the raw ones are still needed (rejects keep raw values)

# reject reasons, checked in this order; the first that applies is recorded
BAD_FIELD_COUNT = "bad_field_count"
MISSING_USER_ID = "missing_user_id"
BAD_USER_ID = "bad_user_id"
MISSING_ITEM_ID = "missing_item_id"
BAD_ITEM_ID = "bad_item_id"
BAD_TIMESTAMP = "bad_timestamp"
FUTURE_TIMESTAMP = "future_timestamp"
BAD_VALUE = "bad_value"
REJECT_REASONS = (BAD_FIELD_COUNT, MISSING_USER_ID, BAD_USER_ID, MISSING_ITEM_ID, BAD_ITEM_ID, BAD_TIMESTAMP,
                  FUTURE_TIMESTAMP, BAD_VALUE)  # fmt: skip
FUTURE_TOLERANCE_SECONDS = 86_400  # an event up to a day after the clock of the prepare is kept (clock skew)


def latest_accepted_time() -> int:
    """Seconds since the epoch: the newest event time a prepare running now keeps (its clock plus
    :data:`FUTURE_TOLERANCE_SECONDS`); a later event cannot have happened yet (a device clock error) and is
    rejected as ``future_timestamp``: kept, one such event would set the age of every other event in the
    popularity prior and the daily pipeline's period boundary."""
    return int(time.time()) + FUTURE_TOLERANCE_SECONDS


def _value_expr(raw: str, dtype: pl.DataType) -> pl.Expr:
    col = pl.col(raw)
    number = col.str.strip_chars().cast(pl.Float64, strict=False) if dtype == pl.String else col.cast(pl.Float64, strict=False)
    value = number.cast(pl.Float32)  # a finite float64 beyond float32 (1e40) becomes inf here: a bad_value too
    return pl.when(value.is_finite()).then(value)


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
    # an NDJSON id that is an object, array or boolean is no id: null, so a bad_user_id / bad_item_id
    if SCALAR_ID[USER_ID] in schema:
        user = pl.when(pl.col(SCALAR_ID[USER_ID])).then(user)
    if SCALAR_ID[ITEM_ID] in schema:
        item = pl.when(pl.col(SCALAR_ID[ITEM_ID])).then(item)
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
        .when(~usable_seconds(c(TIMESTAMP)))
        .then(pl.lit(BAD_TIMESTAMP))
    )
    if TIMESTAMP in cols:  # real event times (line order is no time)
        reason = reason.when(c(TIMESTAMP) > latest_accepted_time()).then(pl.lit(FUTURE_TIMESTAMP))
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
