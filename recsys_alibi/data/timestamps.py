"""Raw timestamps -> (whole seconds, nanoseconds within the second), both Int64, as Polars expressions.

The canonical ``timestamp`` is int64 seconds (the file contract), but events are sorted and
de-duplicated at the source's full precision first: ``prepare`` carries the sub-second part in
the internal column ``schema.SUBSECOND`` until the order and the duplicates are settled, then
drops it. Two clicks 800 ms apart are two events, in their true order, with equal seconds.

Rules (docs/data.md, "Timestamps"):

* integers are seconds, or by ``data.timestamp_unit``; with ``auto`` each value is read by its
  size: above 1e11 milliseconds, above 1e14 microseconds, above 1e17 nanoseconds;
* fractional numbers: the fraction is kept to the nanosecond (within float64's precision);
* strings: an integer or a decimal number (as above), or ISO-8601 (``2024-01-02``,
  ``2024-01-02 03:04:05``, ``...T...``, optional fraction kept to the microsecond, optional
  ``Z`` or ``+hh:mm``; naive times are UTC);
* datetimes are converted to UTC at their own resolution (ms, us or ns); dates are midnight UTC.

Seconds are ``floor`` of the exact time, so the nanosecond part is always in ``[0, 1e9)``;
a time before the epoch gives negative seconds (``ingest`` rejects it as ``bad_timestamp``).
"""

from __future__ import annotations

import polars as pl

NS = 1_000_000_000
_PER_SECOND = {"ms": 1_000, "us": 1_000_000, "ns": NS}


def has_subseconds(dtype: pl.DataType, unit: str) -> bool:
    """Whether a column of ``dtype`` read with ``unit`` can carry a time finer than a second."""
    if dtype.is_integer():
        return unit != "s"
    return dtype == pl.String or dtype.is_float() or isinstance(dtype, pl.Datetime)


def _per_second(x: pl.Expr, unit: str) -> pl.Expr:
    """Ticks per second of each integer value ``x`` (Int64) read with ``unit``."""
    if unit == "s":
        return pl.lit(1, pl.Int64)
    if unit == "ms":
        return pl.lit(1_000, pl.Int64)
    return (
        pl.when(x > 100_000_000_000_000_000)
        .then(pl.lit(NS, pl.Int64))
        .when(x > 100_000_000_000_000)
        .then(pl.lit(1_000_000, pl.Int64))
        .when(x > 100_000_000_000)
        .then(pl.lit(1_000, pl.Int64))
        .otherwise(pl.lit(1, pl.Int64))
    )


def _from_ticks(ticks: pl.Expr, unit: str, fraction: pl.Expr | None = None) -> tuple[pl.Expr, pl.Expr]:
    """(seconds, ns) of integer ``ticks`` (+ a fraction of a tick in [0, 1)) read with ``unit``."""
    per = _per_second(ticks, unit)
    seconds = ticks // per  # floor division: the ns part below is never negative
    ns = (ticks % per) * (NS // per)
    if fraction is not None:
        extra = (fraction * (NS / per)).floor().cast(pl.Int64, strict=False)
        ns = ns + pl.min_horizontal(pl.max_horizontal(extra, pl.lit(0, pl.Int64)), NS // per - 1)
    return seconds, ns


def _from_float(x: pl.Expr, unit: str) -> tuple[pl.Expr, pl.Expr]:
    whole = pl.when(x.is_finite()).then(x.floor())
    return _from_ticks(whole.cast(pl.Int64, strict=False), unit, x - whole)


def _from_string(col: pl.Expr, unit: str) -> tuple[pl.Expr, pl.Expr]:
    s = col.str.strip_chars()
    as_int = s.cast(pl.Int64, strict=False)
    as_float = s.cast(pl.Float64, strict=False)
    iso = s.str.replace(r"[zZ]$", "+00:00").str.replace(r"^(\d{4}-\d\d-\d\d)[ T]", "${1}T")
    micros = pl.coalesce(
        iso.str.to_datetime("%Y-%m-%dT%H:%M:%S%.f%:z", strict=False, time_zone="UTC", time_unit="us").dt.epoch("us"),
        iso.str.to_datetime("%Y-%m-%dT%H:%M:%S%.f", strict=False, time_unit="us").dt.epoch("us"),
        iso.str.to_datetime("%Y-%m-%dT%H:%M%:z", strict=False, time_zone="UTC", time_unit="us").dt.epoch("us"),
        iso.str.to_datetime("%Y-%m-%dT%H:%M", strict=False, time_unit="us").dt.epoch("us"),
        iso.str.to_date("%Y-%m-%d", strict=False).cast(pl.Datetime("us")).dt.epoch("us"),
    )
    int_s, int_ns = _from_ticks(as_int, unit)
    float_s, float_ns = _from_float(as_float, unit)
    iso_s, iso_ns = micros // 1_000_000, (micros % 1_000_000) * 1_000
    pick = lambda a, b, c: pl.when(as_int.is_not_null()).then(a).when(as_float.is_finite()).then(b).otherwise(c)  # noqa: E731
    return pick(int_s, float_s, iso_s), pick(int_ns, float_ns, iso_ns)


def usable_seconds(seconds: pl.Expr) -> pl.Expr:
    """True where a timestamp (seconds, from :func:`timestamp_parts`) is usable: read and not
    before the epoch. Elsewhere the event is rejected (``ingest``: ``bad_timestamp``; the pyfunc
    drops it the same way)."""
    return seconds.is_not_null() & (seconds >= 0)


def seconds_of_lists(lists: pl.Expr, inner: pl.DataType, unit: str) -> pl.Expr:
    """A list column of raw times as list<Int64> whole seconds by the rules above (null where
    unreadable), e.g. ``seconds_of_lists(pl.col("timestamp"), pl.Int64, "auto")``.

    Raises:
        TypeError: ``inner`` (the lists' element type) is not one :func:`timestamp_parts` reads.
    """
    return lists.list.eval(timestamp_parts(pl.element(), inner, unit)[0]).cast(pl.List(pl.Int64))


def timestamp_parts(raw: str | pl.Expr, dtype: pl.DataType, unit: str) -> tuple[pl.Expr, pl.Expr]:
    """(seconds, nanoseconds) expressions for the raw timestamp column ``raw``.

    Args:
        raw: the source column name, or an expression (``pl.element()`` reads list elements).
        dtype: its Polars dtype (String, integer, float, Datetime, Date or Null).
        unit: ``data.timestamp_unit``: ``"auto"``, ``"s"`` or ``"ms"``.

    Returns:
        Two Int64 expressions: seconds since the epoch (UTC, floored) and the nanoseconds
        within that second, in ``[0, 1e9)``; both null when the value cannot be read.

    Raises:
        TypeError: ``dtype`` is none of the above (``ingest`` turns it into a DataError).
    """
    col = pl.col(raw) if isinstance(raw, str) else raw
    if dtype == pl.String:
        return _from_string(col, unit)
    if dtype.is_integer():
        return _from_ticks(col.cast(pl.Int64, strict=False), unit)
    if dtype.is_float():
        return _from_float(col.cast(pl.Float64), unit)
    if isinstance(dtype, pl.Datetime):  # the physical value is UTC whether or not a zone is attached
        per = _PER_SECOND[dtype.time_unit or "us"]
        ticks = col.dt.epoch(dtype.time_unit or "us")
        return ticks // per, (ticks % per) * (NS // per)
    if dtype == pl.Date:
        return col.cast(pl.Datetime("us")).dt.epoch("s"), pl.lit(0, pl.Int64)
    if dtype == pl.Null:
        return col.cast(pl.Int64), col.cast(pl.Int64)
    raise TypeError(f"unsupported timestamp dtype {dtype}")
