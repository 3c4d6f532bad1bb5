"""The item table (``prepare --items``, ``data.items``): read, check against its declaration, clean.

An item table holds one row per item, keyed by the raw item id of the events, with the feature
columns ``data.item_features`` declares (never guessed):

* **categorical** columns: one value or a list of values per item (genres, tags, brand). Values
  are kept as text: integers as their digits, booleans as ``true``/``false``; a text value is
  split on ``item_features.separator`` (``"Action|Comedy"`` -> two values); blanks and nulls
  are dropped, repeats inside one item kept once (first order). An item with no value is allowed.
* **numeric** columns: one number per item (year, price), Float64 here (float32 in the model);
  a null is a missing value (allowed, counted).

:func:`read_item_table` reads Parquet, CSV/TSV (every column as text, parsed here) or NDJSON
(``.gz`` too). :func:`check_declaration` refuses, with one line (:class:`DataError`), a table that
cannot match its declaration: a declared column or the id column missing, a numeric column whose
type holds no numbers (a list, a boolean, text without a single number), a categorical column of
a type that is no category (floats, structs, nested lists).

:func:`clean_item_table` then splits the rows into accepted rows and rejects (nothing is dropped
silently); each reject gets the first reason that applies, in this order:

=========================== ====================================================================
``null_item_id``            the id is null
``bad_item_id``             the id is not an id of the events' type (a text id where the events'
                            ids are integers must round-trip: ``7`` yes, ``007``/``7.0`` no; a float)
``bad_number:COL``          a numeric text cell that is no number
``non_finite:COL``          NaN or infinite
``out_of_range:COL``        beyond float32 (the model's precision), or outside ``ranges.COL``
``duplicate_item_id``       the id is on several rows: every one of them is rejected (which
                            row is right is not guessed)
=========================== ====================================================================

Rejects are kept as ``source`` (the file), ``row`` (0-based row of the file), ``item_id`` (the
cell as text), ``reject_reason`` and ``record`` (the row as JSON): one schema whatever the table's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from recsys_alibi.config import ItemFeaturesConfig
from recsys_alibi.data.errors import DataError, read_error, unread_compression
from recsys_alibi.data.formats import literal, not_a_file, stem_suffix
from recsys_alibi.data.ids import round_trips
from recsys_alibi.data.schema import ITEM_ID, ITEM_IDX, REJECT_REASON

ROW = "row"
SOURCE = "source"
RECORD = "record"
REJECT_COLUMNS = {SOURCE: pl.String, ROW: pl.Int64, ITEM_ID: pl.String, REJECT_REASON: pl.String, RECORD: pl.String}
FLOAT32_MAX = float(np.finfo(np.float32).max)
_CATEGORY_TYPES = (pl.String, pl.Boolean, pl.Categorical, pl.Enum)
_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".tsv": "csv", ".ndjson": "ndjson",
             ".jsonl": "ndjson", ".json": "ndjson"}  # fmt: skip


@dataclass(frozen=True)
class ItemTable:
    """A read item table: ``frame`` (its own columns plus ``row``), the file and whether cells are text."""

    frame: pl.DataFrame
    path: Path
    text: bool  # CSV: every column read as text, numbers parsed by clean_item_table


def read_item_table(path: str | Path) -> ItemTable:
    """Read an item table file (format from its name: ``.parquet``, ``.csv``/``.tsv``, ``.ndjson``/``.jsonl``, ``.gz`` ok).

    Raises:
        DataError: the file is missing, of another format, unreadable or has no columns.
    """
    path = Path(path)
    if not path.is_file():  # what is there instead, and why it is refused (recsys_alibi.data.formats)
        raise not_a_file(path, "item table", "--items (data.items)", takes="file")
    compressed = unread_compression(path)  # bzip2, xz, zstd, zip: refused as the event files are
    if compressed is not None:
        raise compressed
    name, _ = stem_suffix(path)
    fmt = _SUFFIXES.get(Path(name).suffix)
    if fmt is None:
        raise DataError(f"item table '{path}': unknown format; name it .parquet, .csv, .tsv or .ndjson (.gz ok)")
    try:
        if fmt == "parquet":
            frame = pl.read_parquet(path, glob=False)  # 'items[1].parquet' is that file, not a glob
        elif fmt == "csv":
            sep = "\t" if Path(name).suffix == ".tsv" else ","
            frame = pl.read_csv(path, separator=sep, infer_schema=False, glob=False)  # every column text: parsed per cell
        else:
            frame = pl.read_ndjson(literal(path))  # read_ndjson always globs
    except (pl.exceptions.PolarsError, OSError, ValueError) as err:
        layout = "an item table .csv is comma-separated (.tsv: tab-separated) with a header row" if fmt == "csv" else ""
        raise read_error([path], fmt, err, layout or "check the file", what="item table ") from None
    if not frame.width:
        raise DataError(f"item table '{path}' has no columns")
    if ROW in frame.columns:
        frame = frame.rename({ROW: f"{ROW}_"})  # never collides with the row number added here
    return ItemTable(frame.with_row_index(ROW).with_columns(pl.col(ROW).cast(pl.Int64)), path, fmt == "csv")


def _category_type(dtype: pl.DataType) -> bool:
    return dtype.is_integer() or isinstance(dtype, _CATEGORY_TYPES) or dtype in (pl.String, pl.Boolean, pl.Null)


def check_declaration(table: ItemTable, feats: ItemFeaturesConfig) -> None:
    """Refuse a table that cannot match its declaration (module doc), one line naming the column.

    Raises:
        DataError: a declared column or the id column is missing; a numeric column of a type
            that holds no numbers; a categorical column of another type than text, integers,
            booleans or lists of them.
    """
    frame, where = table.frame, f"item table '{table.path}'"
    columns = [c for c in frame.columns if c != ROW]
    for column in (feats.id_column, *feats.columns):
        if column not in frame.columns:
            what = "the item id column (data.item_features.id_column)" if column == feats.id_column else "declared in data.item_features"
            raise DataError(f"{where}: no column '{column}' ({what}); its columns are {columns}")
    for column in feats.numeric:
        dtype = frame.schema[column]
        if dtype.is_numeric() or dtype == pl.Null:
            continue
        if dtype == pl.String:
            cells = frame.get_column(column).str.strip_chars()
            cells = cells.filter(cells.is_not_null() & (cells != ""))
            if cells.len() == 0 or cells.cast(pl.Float64, strict=False).null_count() < cells.len():
                continue
        raise DataError(
            f"{where}: column '{column}' is declared numeric (data.item_features.numeric) but holds "
            f"{'no number' if dtype == pl.String else dtype}; declare it categorical or give numbers"
        )
    for column in feats.categorical:
        dtype = frame.schema[column]
        inner = dtype.inner if isinstance(dtype, pl.List) else dtype
        if not _category_type(inner):
            raise DataError(
                f"{where}: column '{column}' is declared categorical but holds {dtype}; categories are text, "
                "integers, booleans or lists of them (declare numbers numeric)"
            )


def id_as(column: str, dtype: pl.DataType, id_dtype: pl.DataType, from_text: bool = False) -> pl.Expr:
    """The id cells in the events' id type; null where they are not an id of that type.

    ``from_text``: the cells come from a text file (CSV/TSV), whose ids are stripped of surrounding spaces as the
    events' text formats strip theirs (:func:`recsys_alibi.data.ids.id_expr`): ``b `` in both files is one item."""
    col = pl.col(column)
    if id_dtype == pl.String:
        if dtype == pl.String and from_text:
            stripped = col.str.strip_chars()
            return pl.when(stripped != "").then(stripped)
        return col.cast(pl.String) if (dtype.is_integer() or dtype == pl.String) else pl.lit(None, pl.String)
    if dtype == pl.String:
        text = col.str.strip_chars()
        return pl.when(round_trips(text)).then(text.cast(pl.Int64, strict=False))
    if dtype.is_integer():
        return col.cast(pl.Int64, strict=False)
    return pl.lit(None, pl.Int64)


def _categories(column: str, dtype: pl.DataType, separator: str | None) -> pl.Expr:
    """The cell as List(String): values as text, split on ``separator``, blanks dropped, each once."""
    col = pl.col(column)
    inner = dtype.inner if isinstance(dtype, pl.List) else dtype
    as_text = (lambda e: e.cast(pl.String)) if inner != pl.Boolean else (
        lambda e: pl.when(e).then(pl.lit("true")).when(~e).then(pl.lit("false")))  # fmt: skip
    values = col.list.eval(as_text(pl.element())) if isinstance(dtype, pl.List) else pl.concat_list(as_text(col))
    if separator is not None:
        values = values.list.eval(pl.element().str.split(separator).explode())
    values = values.list.eval(pl.element().str.strip_chars()).list.eval(pl.element().filter(pl.element().is_not_null() & (pl.element() != "")))
    return values.list.unique(maintain_order=True).fill_null(pl.lit([], pl.List(pl.String))).alias(column)


def _number(column: str, dtype: pl.DataType) -> pl.Expr:
    col = pl.col(column)
    if dtype == pl.String:
        text = col.str.strip_chars()
        return pl.when(text != "").then(text.cast(pl.Float64, strict=False)).alias(column)
    return col.cast(pl.Float64).alias(column)


def _number_reason(column: str, dtype: pl.DataType, ranges: dict[str, list[float]]) -> pl.Expr:
    """The reject reason of a numeric cell (null when it is fine or missing)."""
    raw, value = pl.col(column), _number(column, dtype)
    bad = (raw.str.strip_chars() != "") & value.is_null() if dtype == pl.String else pl.lit(False)
    low, high = ranges.get(column, (-FLOAT32_MAX, FLOAT32_MAX))
    low, high = max(low, -FLOAT32_MAX), min(high, FLOAT32_MAX)
    return (
        pl.when(bad).then(pl.lit(f"bad_number:{column}"))
        .when(value.is_nan() | value.is_infinite()).then(pl.lit(f"non_finite:{column}"))
        .when((value < low) | (value > high)).then(pl.lit(f"out_of_range:{column}"))
    )  # fmt: skip


def clean_item_table(table: ItemTable, feats: ItemFeaturesConfig, id_dtype: pl.DataType) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Accepted rows and rejects of a table (module doc for the reasons), declaration checked first.

    Args:
        table: from :func:`read_item_table`.
        feats: ``data.item_features``.
        id_dtype: the events' raw item id type (Int64 or String).

    Returns:
        ``(accepted, rejects)``: accepted ``item_id`` (``id_dtype``), each categorical column
        List(String), each numeric column Float64 (null = missing), in the table's row order;
        rejects with the columns of ``REJECT_COLUMNS``.

    Raises:
        DataError: see :func:`check_declaration`.
    """
    check_declaration(table, feats)
    frame, schema = table.frame, table.frame.schema
    ids = id_as(feats.id_column, schema[feats.id_column], id_dtype, table.text).alias(ITEM_ID)
    reasons = [
        pl.when(pl.col(feats.id_column).is_null()).then(pl.lit("null_item_id")),
        pl.when(ids.is_null()).then(pl.lit("bad_item_id")),
        *(_number_reason(c, schema[c], feats.ranges) for c in feats.numeric),
    ]
    tagged = frame.with_columns(ids.alias("_id"), pl.coalesce(reasons).alias(REJECT_REASON))
    duplicated = pl.col("_id").is_not_null() & pl.col("_id").is_duplicated()
    tagged = tagged.with_columns(
        pl.when(pl.col(REJECT_REASON).is_null() & duplicated).then(pl.lit("duplicate_item_id")).otherwise(pl.col(REJECT_REASON))
        .alias(REJECT_REASON)
    )  # fmt: skip
    bad = tagged.filter(pl.col(REJECT_REASON).is_not_null())
    own = [c for c in frame.columns if c != ROW]
    rejects = bad.select(
        pl.lit(str(table.path)).alias(SOURCE), pl.col(ROW), pl.col(feats.id_column).cast(pl.String).alias(ITEM_ID),
        pl.col(REJECT_REASON), pl.struct(own).struct.json_encode().alias(RECORD),
    )  # fmt: skip
    accepted = tagged.filter(pl.col(REJECT_REASON).is_null()).select(
        pl.col("_id").alias(ITEM_ID),
        *(_categories(c, schema[c], feats.separator) for c in feats.categorical),
        *(_number(c, schema[c]) for c in feats.numeric),
    )
    return accepted, rejects.cast(REJECT_COLUMNS)


def empty_rejects() -> pl.DataFrame:
    """A rejects frame with no rows (``REJECT_COLUMNS``)."""
    return pl.DataFrame(schema=REJECT_COLUMNS)


def feature_rows_schema(feats: ItemFeaturesConfig, id_dtype: pl.DataType) -> dict[str, pl.DataType]:
    """The columns of the prepared ``item_features.parquet``: ids, then each declared column."""
    return {ITEM_ID: id_dtype, ITEM_IDX: pl.Int32, **{c: pl.List(pl.String) for c in feats.categorical},
            **{c: pl.Float64 for c in feats.numeric}}  # fmt: skip
