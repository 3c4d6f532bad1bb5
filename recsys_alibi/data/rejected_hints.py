"""Why every row of an input was rejected, when the rejects say more than their counts: one clause for the
refusal of ``prepare`` (:func:`all_rejected_hint`).

Each rule looks at the reasons and at a few first lines of the input, never at the whole file:

* a format inferred from the file's name (``.dat`` is MovieLens): said so, and ``--format`` named;
* every sniffed CSV line ends with the separator and the header does not (a trailing tab): each row has one
  field more than the header;
* every row ``bad_timestamp``: the accepted timestamp forms, and the first value rejected.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from recsys_alibi.data.errors import GZIP_ERRORS, open_bytes
from recsys_alibi.data.formats import SNIFF_LINES
from recsys_alibi.data.readers import Source
from recsys_alibi.data.schema import TIMESTAMP

TIMESTAMP_FORMS = (
    "integers (seconds; milliseconds, microseconds or nanoseconds told by size, or data.timestamp_unit), decimal "
    "numbers, and ISO-8601 such as 2024-01-02, 2024-01-02 03:04:05 or 2024-01-02T03:04:05.123Z (an optional Z or "
    "+hh:mm offset)"
)
SEPARATOR_NAMES = {"\t": "tab", ",": "comma", ";": "semicolon", "|": "'|'", " ": "space"}


def _first_lines(path: Path) -> list[str]:
    """Up to ``SNIFF_LINES`` first lines of a text file (without line ends; bytes that are not UTF-8 replaced)."""
    try:
        with open_bytes(path) as fh:
            lines = [fh.readline() for _ in range(SNIFF_LINES)]
    except GZIP_ERRORS:
        return []
    return [ln.decode("utf-8", "replace").rstrip("\r\n") for ln in lines if ln]


def trailing_separator(source: Source) -> str | None:
    """The clause for a CSV whose data lines all end with the separator while its header does not, or None."""
    separator = source.csv_read.get("separator")
    if separator is None or not source.paths:
        return None
    lines = _first_lines(source.paths[0])
    header, data = (lines[0], lines[1:]) if source.csv_read.get("has_header") and lines else ("", lines)
    data = [ln for ln in data if ln.strip()]
    if not data or header.endswith(separator) or not all(ln.endswith(separator) for ln in data):
        return None
    name = SEPARATOR_NAMES.get(separator, repr(separator))
    path = source.paths[0]
    shown = "\\t" if separator == "\t" else separator
    sed = f"s/{shown}$//"
    return (f"every line of '{path}' ends with a {name} (a trailing separator), so each row has one field more than "
            f"the header; remove it, e.g. sed '{sed}' '{path}' > fixed{path.suffix}")  # fmt: skip


def bad_timestamps(source: Source, rejects: Path) -> str:
    """The clause for an input whose every row is ``bad_timestamp``: the first value rejected and the forms read."""
    raw = source.columns.get(TIMESTAMP)
    sample = ""
    if raw is not None and rejects.is_file():
        try:
            values = pl.scan_parquet(rejects).select(pl.col(raw).cast(pl.String)).head(1).collect()[raw].to_list()
        except pl.exceptions.PolarsError:
            values = []
        if values and values[0] is not None:
            sample = f" (the first: {values[0][:40]!r} in column '{raw}')"
    return (f"no timestamp could be read{sample}; the forms read are {TIMESTAMP_FORMS}; convert the column, map "
            "another one with --set data.columns.timestamp=NAME, or null to use the line order as time")


def all_rejected_hint(source: Source, by_reason: dict[str, int], rejects: Path) -> str | None:
    """One clause saying why every row was rejected, or None when the reasons say it all."""
    total = sum(by_reason.values())
    hints = []
    if source.inferred and source.inferred.startswith("from its name") and source.fmt != "csv":
        hints.append(f"'{source.paths[0]}' was read as {source.fmt}, a format inferred {source.inferred}; if it has "
                     "another layout, pass --format (e.g. --format csv with data.columns)")  # fmt: skip
    if source.fmt == "csv" and by_reason.get("bad_field_count", 0) * 2 > total:
        trailing = trailing_separator(source)
        if trailing is not None:
            hints.append(trailing)
    if by_reason.get("bad_timestamp", 0) == total:
        hints.append(bad_timestamps(source, rejects))
    return "; ".join(hints) if hints else None
