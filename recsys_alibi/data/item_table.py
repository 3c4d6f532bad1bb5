"""The item table (``prepare --items``, ``data.items``): read, check against its declaration, clean.

An item table holds one row per item, keyed by the raw item id of the events, with the feature
columns ``data.item_features`` declares (never guessed):

* **categorical** columns: one value or a list of values per item (genres, tags, brand). Values
  are kept as text: integers as their digits, booleans as ``true``/``false``; a text value is
  split on ``item_features.separator`` (``"Action|Comedy"`` -> two values); blanks and nulls
  are dropped, repeats inside one item kept once (first order). An item with no value is allowed.
* **numeric** columns: one number per item (year, price), Float64 here (float32 in the model);
  a null is a missing value (allowed, counted).

:func:`read_item_table` reads a file, a folder or a glob of files of one format (Parquet, CSV/TSV with every
column as text, parsed here, or NDJSON; ``.gz`` too), by the rule of every user-given path
(:func:`recsys_alibi.data.formats.resolve_paths`). :func:`check_declaration` refuses, with one line (:class:`DataError`), a table that
cannot match its declaration: a declared column or the id column missing, a numeric column whose
type holds no numbers (a list, a boolean, text without a single number), a categorical column of
a type that is no category (floats, structs, nested lists).

:func:`clean_item_table` then splits the rows into accepted rows and rejects (nothing is dropped
silently); each reject gets the first reason that applies, in this order:

=========================== ====================================================================
``bad_field_count``         CSV: the row has another number of fields than the header
``null_item_id``            the id is null
``bad_item_id``             the id is not an id of the events' type (a text id where the events'
                            ids are integers must round-trip: ``7`` yes, ``007``/``7.0`` no; a float;
                            NDJSON: a list, an object, true or false; ``1501.0`` is ``1501``)
``bad_category:COL``        NDJSON: a categorical cell that is an object or a list holding lists or objects
``bad_number:COL``          a numeric text cell that is no number
``non_finite:COL``          NaN or infinite
``out_of_range:COL``        beyond float32 (the model's precision), or outside ``ranges.COL``
``duplicate_item_id``       the id is on several rows: every one of them is rejected (which
                            row is right is not guessed)
=========================== ====================================================================

Rejects are kept as ``source`` (the file), ``row`` (0-based row of that file), ``item_id`` (the
cell as text), ``reject_reason`` and ``record`` (the row as JSON): one schema whatever the table's.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from recsys_alibi.config import ItemFeaturesConfig
from recsys_alibi.data.errors import DataError, bad_ndjson_line, first_line, open_bytes, unread_compression
from recsys_alibi.data.read_errors import read_error
from recsys_alibi.data.formats import literal, resolve_paths, stem_suffix
from recsys_alibi.data.ids import round_trips
from recsys_alibi.data.readers import FIELDS_OK, JSON_BLANK, with_field_check
from recsys_alibi.data.schema import ITEM_ID, ITEM_IDX, REJECT_REASON

log = logging.getLogger(__name__)

ROW = "row"
SOURCE = "source"
RECORD = "record"
FILE = "_file"  # internal: the file of the row (a table may be a folder or a glob of files)
_INTERNAL = (ROW, FILE, FIELDS_OK)
REJECT_COLUMNS = {SOURCE: pl.String, ROW: pl.Int64, ITEM_ID: pl.String, REJECT_REASON: pl.String, RECORD: pl.String}
FLOAT32_MAX = float(np.finfo(np.float32).max)
CSV_LAYOUT = "an item table .csv is comma-separated (.tsv: tab-separated) with a header row"
_POS = "_pos"  # internal: the row's position in the table (all files)
_CATEGORY_TYPES = (pl.String, pl.Boolean, pl.Categorical, pl.Enum)
_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".tsv": "csv", ".ndjson": "ndjson",
             ".jsonl": "ndjson", ".json": "ndjson"}  # fmt: skip


@dataclass(frozen=True)
class ItemTable:
    """A read item table: ``frame`` (its own columns plus ``row``, ``_file`` and, CSV, ``_fields_ok``), the path
    given (a file, folder or glob), its files and their format."""

    frame: pl.DataFrame
    path: Path
    fmt: str  # parquet, csv (every column read as text, numbers parsed by clean_item_table) or ndjson
    paths: tuple[Path, ...] = ()

    @property
    def text(self) -> bool:
        return self.fmt == "csv"

    @property
    def columns(self) -> list[str]:
        """The table's own columns."""
        return [c for c in self.frame.columns if c not in _INTERNAL]


def _format(path: Path) -> str:
    fmt = _SUFFIXES.get(Path(stem_suffix(path)[0]).suffix)
    if fmt is None:
        raise DataError(f"item table '{path}': unknown format; name it .parquet, .csv, .tsv or .ndjson (.gz ok)")
    return fmt


def read_item_table(path: str | Path) -> ItemTable:
    """Read an item table: a file, a folder (every file below it but names starting with ``.`` or ``_``) or a glob
    (:func:`recsys_alibi.data.formats.resolve_paths`) of files of one format, told by their names (``.parquet``,
    ``.csv``/``.tsv``, ``.ndjson``/``.jsonl``, ``.gz`` ok). Rows are numbered per file.

    CSV: every cell is text; a row with another number of fields than the header gets ``_fields_ok`` False (a
    ``bad_field_count`` reject), unless a quoted field spans lines (then read without that check, with a
    warning). NDJSON: each column's type is inferred from every line; a column holding values of several
    JSON types is read as text (a number as its JSON text, a list as its JSON), sorted out by :func:`clean_item_table`.

    Raises:
        DataError: nothing there (or a FIFO, a device), a file of an unknown format or files of several, a
            file that cannot be read, files whose columns differ (CSV, Parquet) or whose types do not combine,
            no columns.
    """
    paths = resolve_paths(path, "item table", "--items (data.items)")
    formats = []
    for file in paths:
        compressed = unread_compression(file)  # bzip2, xz, zstd, zip: refused as the event files are
        if compressed is not None:
            raise compressed
        formats.append(_format(file))
    other = next((i for i, fmt in enumerate(formats) if fmt != formats[0]), None)
    if other is not None:
        raise DataError(f"item table '{path}' mixes formats: '{paths[0]}' is {formats[0]}, '{paths[other]}' "
                        f"{formats[other]}; give files of one format")  # fmt: skip
    fmt = formats[0]
    frames = [_read_file(file, fmt) for file in paths]
    own = [[c for c in frame.columns if c not in _INTERNAL] for frame in frames]
    for file, columns in zip(paths[1:], own[1:]):  # NDJSON: a field absent from one file is a missing value
        if fmt != "ndjson" and columns != own[0]:
            raise DataError(f"item table '{file}' has other columns than '{paths[0]}' ({columns} against {own[0]}); "
                            "every file of one table has the same columns")  # fmt: skip
    try:
        frame = pl.concat(frames, how="diagonal_relaxed")
    except pl.exceptions.PolarsError as err:
        raise DataError(f"item table '{path}': the columns of its files have types that do not combine "
                        f"({first_line(err)}); give each column one type in every file") from None  # fmt: skip
    table = ItemTable(frame, Path(path), fmt, tuple(paths))
    if not table.columns:
        raise DataError(f"item table '{path}' has no columns")
    return table


def _read_file(path: Path, fmt: str) -> pl.DataFrame:
    """One file of an item table, with ``row`` (0-based) and ``_file``; a column of the file named like those is
    renamed with a trailing ``_``."""
    try:
        if fmt == "parquet":
            frame = pl.read_parquet(path, glob=False)  # 'items[1].parquet' is that file, not a glob
        elif fmt == "csv":
            frame = _read_csv(path)
        else:
            frame = _read_ndjson(path)
    except (pl.exceptions.PolarsError, OSError, ValueError) as err:
        separator = "\t" if stem_suffix(path)[0].endswith(".tsv") else ","  # as _read_csv reads it
        raise read_error([path], fmt, err, CSV_LAYOUT if fmt == "csv" else "check the file", what="item table ",
                         separator=separator) from None  # fmt: skip
    frame = frame.rename({c: f"{c}_" for c in frame.columns if c in (ROW, FILE)})  # never the columns added here
    return frame.with_row_index(ROW).with_columns(pl.col(ROW).cast(pl.Int64), pl.lit(str(path)).alias(FILE))


def _read_ndjson(path: Path) -> pl.DataFrame:
    """An NDJSON file, each field's type inferred from every line (a late string among numbers is no read error;
    a field of several JSON types is text); when no type holds a field's values (an object among numbers), every
    field as text (a number, list or object as its JSON text)."""
    try:
        return pl.read_ndjson(literal(path), infer_schema_length=None)  # read_ndjson always globs
    except pl.exceptions.PolarsError:
        if bad_ndjson_line(path) is not None:  # a line that is no JSON object: read_error names it
            raise
    with open_bytes(path) as fh:
        keys = dict.fromkeys(key for raw in fh if raw.strip(JSON_BLANK.encode() + b"\n") for key in json.loads(raw))
    return pl.read_ndjson(literal(path), schema=dict.fromkeys(keys, pl.String))


def _read_csv(path: Path) -> pl.DataFrame:
    """A CSV/TSV file, every cell as text, with ``_fields_ok`` (:func:`recsys_alibi.data.readers.with_field_check`)."""
    separator = "\t" if stem_suffix(path)[0].endswith(".tsv") else ","
    lf = pl.scan_csv(path, separator=separator, infer_schema=False, glob=False, truncate_ragged_lines=True,
                     raise_if_empty=True)  # fmt: skip
    lf = lf.rename({c: f"{c}_" for c in lf.collect_schema().names() if c == FIELDS_OK})
    try:
        return with_field_check(lf, [path], separator, True, lf.collect_schema().len()).collect()
    except pl.exceptions.ShapeError:  # rows are not lines: a quoted field spans lines
        log.warning("item table %s: quoted fields span lines, so the fields of its rows are not counted line by line; "
                    "a short row's missing cells are read as missing values", path)  # fmt: skip
        return lf.collect()


def _category_type(dtype: pl.DataType) -> bool:
    return dtype.is_integer() or isinstance(dtype, _CATEGORY_TYPES) or dtype in (pl.String, pl.Boolean, pl.Null)


def check_declaration(table: ItemTable, feats: ItemFeaturesConfig) -> None:
    """Refuse a table that cannot match its declaration (module doc), one line naming the column.

    Raises:
        DataError: a declared column or the id column is missing; a numeric column of a type
            that holds no numbers; a categorical column of another type than text, integers,
            booleans or lists of them.
    """
    frame, where, columns = table.frame, f"item table '{table.path}'", table.columns
    for column in (feats.id_column, *feats.columns):
        if column not in columns:
            what = "the item id column (data.item_features.id_column)" if column == feats.id_column else "declared in data.item_features"
            layout = f"; {CSV_LAYOUT}" if table.text else ""
            raise DataError(f"{where}: no column '{column}' ({what}); its columns are {columns}{layout}")
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
    frame, json_reasons = table.frame.with_row_index(_POS), []
    if table.fmt == "ndjson":
        frame, json_reasons = _json_cells(table, frame, feats)
    schema = frame.schema
    ids = id_as(feats.id_column, schema[feats.id_column], id_dtype, table.text).alias(ITEM_ID)
    reasons = [
        *([pl.when(~pl.col(FIELDS_OK)).then(pl.lit("bad_field_count"))] if FIELDS_OK in schema else []),
        pl.when(pl.col(feats.id_column).is_null()).then(pl.lit("null_item_id")),
        pl.when(ids.is_null()).then(pl.lit("bad_item_id")),
        *json_reasons,
        *(_number_reason(c, schema[c], feats.ranges) for c in feats.numeric),
    ]
    tagged = frame.with_columns(ids.alias("_id"), pl.coalesce(reasons).alias(REJECT_REASON))
    duplicated = pl.col("_id").is_not_null() & pl.col("_id").is_duplicated()
    tagged = tagged.with_columns(
        pl.when(pl.col(REJECT_REASON).is_null() & duplicated).then(pl.lit("duplicate_item_id")).otherwise(pl.col(REJECT_REASON))
        .alias(REJECT_REASON)
    )  # fmt: skip
    bad = tagged.filter(pl.col(REJECT_REASON).is_not_null())
    raw = table.frame[bad.get_column(_POS)]  # the rows as read (NDJSON: before their cells were sorted out)
    rejects = raw.select(
        pl.col(FILE).alias(SOURCE), pl.col(ROW), bad.get_column(feats.id_column).cast(pl.String).alias(ITEM_ID),
        bad.get_column(REJECT_REASON), _record(raw, table.columns),
    )  # fmt: skip
    accepted = tagged.filter(pl.col(REJECT_REASON).is_null()).select(
        pl.col("_id").alias(ITEM_ID),
        *(_categories(c, schema[c], feats.separator) for c in feats.categorical),
        *(_number(c, schema[c]) for c in feats.numeric),
    )
    return accepted, rejects.cast(REJECT_COLUMNS)


def _record(frame: pl.DataFrame, columns: list[str]) -> pl.Expr:
    """The row as JSON; in a row with a NaN or infinite float, floats as text (``"NaN"``, ``"inf"``): JSON has no such
    number, and the encoder writes null."""
    plain = pl.struct(columns).struct.json_encode()
    floats = [c for c in columns if frame.schema[c].is_float()]
    if not floats:
        return plain.alias(RECORD)
    text = pl.struct(*(pl.col(c).cast(pl.String) if c in floats else pl.col(c) for c in columns)).struct.json_encode()
    odd = pl.any_horizontal(*(~pl.col(c).is_finite() for c in floats)).fill_null(False)
    return pl.when(odd).then(text).otherwise(plain).alias(RECORD)


def _json_cells(table: ItemTable, frame: pl.DataFrame, feats: ItemFeaturesConfig) -> tuple[pl.DataFrame, list[pl.Expr]]:
    """An NDJSON table's cells sorted out where a column mixes JSON types (the reader gave such a column as text)
    or a list holds lists, and the reasons of the rows that are no item (module doc).

    * an id column of floats (integers and ``1501.0``): read again as text, as the events' NDJSON reader reads
      ids (``1501.0`` is ``1501``, no digit of a large integer lost);
    * an id that is a list, an object, true or false: ``bad_item_id``;
    * a categorical cell that is a list among text: its values (as the reader writes them); an object, or a
      list holding lists or objects: ``bad_category:COL``.

    Cells that only may be such (text starting with ``[`` or ``{``, ``true``/``false`` ids) are decided by
    Python's ``json`` on their lines.
    """
    schema, id_column = frame.schema, feats.id_column
    if schema[id_column].is_float():
        texts = [pl.read_ndjson(literal(p), schema={id_column: pl.String}) for p in table.paths]
        frame = frame.with_columns(pl.concat(texts).get_column(id_column))
    looks = r"^\s*[\[{]"
    suspects = {id_column: pl.col(id_column).str.contains(looks) | pl.col(id_column).is_in(["true", "false"])}
    if frame.schema[id_column] != pl.String:
        suspects = {}
    for column in feats.categorical:
        if schema[column] == pl.String:
            suspects[column] = pl.col(column).str.contains(looks)
        elif schema[column] == pl.List(pl.String):
            suspects[column] = pl.col(column).list.eval(pl.element().str.contains(looks)).list.any()
    rows = frame.filter(pl.any_horizontal(*suspects.values()).fill_null(False)) if suspects else frame.clear()
    values = _json_rows(rows.select(_POS, FILE, ROW))
    reasons = []
    for column in suspects:
        cells = {pos: row.get(column) for pos, row in values.items()}
        if column == id_column:
            bad = [pos for pos, v in cells.items() if isinstance(v, (list, dict, bool))]
            reasons.append(pl.when(_at(bad)).then(pl.lit("bad_item_id")))
            continue
        lists = {pos: _category_texts(v) for pos, v in cells.items() if isinstance(v, (list, dict))}
        bad = [pos for pos, v in lists.items() if v is None]
        reasons.append(pl.when(_at(bad)).then(pl.lit(f"bad_category:{column}")))
        if schema[column] == pl.String:  # text and lists: every cell a list
            patch = pl.DataFrame({_POS: list(lists), "_list": list(lists.values())},
                                 schema={_POS: pl.UInt32, "_list": pl.List(pl.String)})  # fmt: skip
            frame = frame.join(patch, on=_POS, how="left", maintain_order="left").with_columns(
                pl.coalesce("_list", pl.concat_list(pl.col(column))).alias(column)).drop("_list")  # fmt: skip
    return frame, reasons


def _at(positions: list[int]) -> pl.Expr:
    return pl.col(_POS).is_in(pl.Series(positions, dtype=pl.UInt32).implode())


def _category_texts(value: object) -> list[str | None] | None:
    """A JSON list's values as category text (as the NDJSON reader writes them); None for an object or a list
    holding lists or objects (no category)."""
    if not isinstance(value, list) or any(isinstance(v, (list, dict)) for v in value):
        return None
    return [v if v is None or isinstance(v, str) else json.dumps(v) for v in value]


def _json_rows(rows: pl.DataFrame) -> dict[int, dict]:
    """``_pos`` -> the JSON object of each of ``rows`` (``_pos``, ``_file``, ``row``), parsed from its line (lines
    numbered as the NDJSON reader numbers rows: blank ones skipped)."""
    found: dict[int, dict] = {}
    line = pl.col("line")
    for (file,), part in rows.group_by(FILE):
        lines = (
            pl.scan_lines(file, glob=False).filter(line.str.strip_chars(JSON_BLANK) != "").with_row_index(ROW)
            .with_columns(pl.col(ROW).cast(pl.Int64)).join(part.lazy(), on=ROW).select(_POS, "line").collect()
        )  # fmt: skip
        found.update((pos, json.loads(text)) for pos, text in lines.iter_rows())
    return found


def empty_rejects() -> pl.DataFrame:
    """A rejects frame with no rows (``REJECT_COLUMNS``)."""
    return pl.DataFrame(schema=REJECT_COLUMNS)


def feature_rows_schema(feats: ItemFeaturesConfig, id_dtype: pl.DataType) -> dict[str, pl.DataType]:
    """The columns of the prepared ``item_features.parquet``: ids, then each declared column."""
    return {ITEM_ID: id_dtype, ITEM_IDX: pl.Int32, **{c: pl.List(pl.String) for c in feats.categorical},
            **{c: pl.Float64 for c in feats.numeric}}  # fmt: skip
