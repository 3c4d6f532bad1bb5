"""Raw ids -> canonical ids, and the rule that types text ids without ever merging two spellings.

Text formats (CSV/TSV, MovieLens, SASRec, S3-Rec) and NDJSON ids that are numbers are read as
text. With ``data.id_type: auto`` a column of them becomes Int64 only when EVERY kept value
round-trips exactly, ``str(int(x)) == x`` (:func:`round_trips`), decided over all rows once they
are read (:func:`integer_id_columns`); one ``007``, ``+7``, ``-0``, ``7.0`` or ``abc`` anywhere
keeps the whole column String. Either way distinct raw spellings stay distinct ids.
``data.id_type: int`` forces integers (``007`` and ``7`` are then one id: a choice the user
makes); ``str`` forces strings. Ids of two types are compared by the same rule
(:func:`same_id_in`): ``7`` and ``"7"`` are one id, ``7`` and ``"007"`` two.
"""

from __future__ import annotations

import polars as pl

from recsys_alibi.data.errors import DataError


def id_expr(raw: str, dtype: pl.DataType, text: bool, id_type: str) -> tuple[pl.Expr, pl.Expr]:
    """(canonical id, is-missing) expressions for the raw id column ``raw`` of type ``dtype``.

    Text ids (``text``: a text format) are stripped of surrounding spaces and stay String unless
    ``id_type`` is ``"int"`` (then a value that does not parse gives a null id: a reject);
    with ``"auto"`` :func:`integer_id_columns` types them once every row is read. Typed
    sources keep their type: integers Int64, integral floats Int64 (a fractional one: null).

    Raises:
        DataError: an id column that is neither integer, float nor string.
    """
    col = pl.col(raw)
    if isinstance(dtype, (pl.Categorical, pl.Enum)):
        col, dtype = col.cast(pl.String), pl.String
    if dtype == pl.String:
        stripped = col.str.strip_chars()
        missing = stripped.is_null() | (stripped == "")
        if text and id_type == "int":
            return stripped.cast(pl.Int64, strict=False), missing
        return stripped if text else col, missing
    if dtype == pl.UInt64 and id_type == "auto":  # 64-bit hashes pass Int64: text, typed by integer_id_columns
        return col.cast(pl.String), col.is_null()
    if dtype.is_integer():
        return col.cast(pl.Int64, strict=False), col.is_null()
    if dtype.is_float():
        ok = col.is_finite() & (col == col.floor())
        return pl.when(ok).then(col.cast(pl.Int64, strict=False)), col.is_null() | col.is_nan()
    if dtype == pl.Null:
        return col.cast(pl.Int64), col.is_null()
    raise DataError(f"id column '{raw}' has type {dtype}; ids must be integers or strings, map another column with data.columns")


def round_trips(ids: pl.Expr) -> pl.Expr:
    """True where a text id is an integer written exactly as Int64 prints it (``str(int(x)) == x``).

    ``7``, ``-5`` and ``0`` do; ``007``, ``+7``, ``-0``, ``7.0``, `` 7`` and integers beyond Int64 do not.
    """
    return (ids.cast(pl.Int64, strict=False).cast(pl.String) == ids).fill_null(False)


def integer_id_columns(events: pl.LazyFrame, candidates: tuple[str, ...]) -> list[str]:
    """The text id columns of ``events`` that can be Int64 without merging two spellings.

    A column qualifies when EVERY value round-trips (:func:`round_trips`), over all rows; one
    ``007``, ``+7`` or ``abc`` anywhere keeps the whole column String. A full pass over the
    candidate columns (streaming).

    Args:
        events: canonical events whose ``candidates`` columns are String.
        candidates: column names (``Source.text_ids``).
    """
    if not candidates:
        return []
    row = events.select(*[round_trips(pl.col(c)).all().alias(c) for c in candidates]).collect(engine="streaming")
    return [c for c in candidates if row[c][0] is not False]


def cast_integer_ids(events: pl.LazyFrame | pl.DataFrame, columns: list[str]):
    """``events`` with the id ``columns`` (from :func:`integer_id_columns`) cast to Int64."""
    return events.with_columns(pl.col(c).cast(pl.Int64) for c in columns) if columns else events


def same_id_in(ids: pl.Expr, source: pl.DataType, target: pl.DataType) -> pl.Expr:
    """Raw ids of type ``source`` as the same ids in type ``target``, never merging two spellings.

    An integer id is the text of its canonical spelling (``7`` -> ``"7"``); a text id is an
    integer only when it round-trips (:func:`round_trips`: ``"7"`` -> 7; ``"007"``, ``"+7"``,
    ``"7.0"``, ``" 7"`` -> null: no integer id is spelled that way); an integer that the
    ``target`` width cannot hold is null. A null matches nothing in a join or ``is_in``, so
    comparing ``same_id_in(a, ...)`` with ``b`` finds exactly the ids that are one id by the
    typing rule of this module.

    Args:
        ids: the id column (expression) of type ``source``.
        source, target: integer types or String.

    Raises:
        TypeError: ``source`` or ``target`` is neither an integer type nor String.
    """
    for dtype in (source, target):
        if not (dtype.is_integer() or dtype == pl.String):
            raise TypeError(f"raw ids are integers or strings, not {dtype}")
    if source == target:
        return ids
    if target == pl.String:
        return ids.cast(pl.String)
    if source == pl.String:
        ids = pl.when(round_trips(ids)).then(ids.cast(pl.Int64, strict=False))
    return ids.cast(target, strict=False)
