"""Quotes in separated text (CSV, TSV), by the readers' rule: a quote is special only where a field starts.

:func:`scan_quotes` reads a file once and finds the first quoted field, one never closed, one with text
after its closing quote (``"Weird Al" Yankovic``), one spanning lines and one that took in whole rows
(an unquoted text field that merely starts with a quote, ``"Heroes``); :func:`quote_error` and
:func:`swallowed_lines_error` turn what it found into one line naming the line, the column and the fix
(:data:`NO_QUOTING`: ``data.quote_char=null`` reads quotes as text).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from recsys_alibi.data.errors import DataError, open_bytes


@dataclass(frozen=True)
class QuoteSpan:
    """A quoted CSV field: the line (from 1) and field (from 1) where its quote opens."""

    line: int
    field: int


@dataclass
class QuoteScan:
    """What one pass over a CSV file finds about its quotes, by the readers' rule (:func:`scan_quotes`).

    Attributes:
        first: the first quoted field.
        unclosed: a quoted field still open at the end of the file.
        stray: the first quoted field with text after its closing quote (``"Weird Al" Yankovic``).
        spans: the first quoted field that spans lines.
        swallowed: the first quoted field that spans lines and holds what looks like whole rows (a line
            inside it with the header's number of fields, or a record of another number of fields
            than the header's): an unquoted text field that merely starts with a quote (``"Heroes``).
        loose: the first field with a quote that is text (not where the field starts: ``The 7" Club``).
        header: the first line's fields.
    """

    first: QuoteSpan | None = None
    unclosed: QuoteSpan | None = None
    stray: QuoteSpan | None = None
    spans: QuoteSpan | None = None
    swallowed: QuoteSpan | None = None
    loose: QuoteSpan | None = None
    header: list[str] = field(default_factory=list)


def scan_quotes(path: Path, separator: str, quote: str = '"') -> QuoteScan:
    """One pass over a CSV file with the quoting rule of Python's ``csv`` and Polars: a quote is special only
    where a field starts; inside a quoted field ``""`` is a quote, and the field may span lines.

    Only lines holding a quote are looked at character by character, so a file without quotes is one fast pass.
    """
    found = QuoteScan()
    width = 0
    open_span: QuoteSpan | None = None
    record_fields = 0  # fields of the record a multi-line quoted field belongs to
    row_like = False
    with open_bytes(path) as fh:
        for number, raw in enumerate(fh, start=1):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if number == 1:
                first = line.removeprefix("\ufeff").rstrip("\r")
                found.header = next(csv.reader([first], delimiter=separator, quotechar=quote), [""])
                width = len(found.header)
            if open_span is None and quote not in line:
                continue
            pos, n = 0, len(line)
            field_no = 1 if open_span is None else record_fields
            inside = carried = open_span is not None  # the line starts within a field opened on an earlier line
            while True:
                if inside:
                    close = _closing_quote(line, pos, quote)
                    if close < 0:  # the field goes on to the next line
                        if carried and line.count(separator) >= width - 1:
                            row_like = True
                        if open_span is None:
                            open_span = QuoteSpan(number, field_no)
                            found.spans = found.spans or open_span
                        record_fields = field_no
                        break
                    if carried:  # a multi-line field closes here
                        row_like = row_like or line.count(separator, 0, close) >= width - 1
                        carried = False
                    pos = close + 1
                    inside = False
                    nxt = line.find(separator, pos)
                    tail = line[pos:] if nxt < 0 else line[pos:nxt]
                    if tail.rstrip("\r") and found.stray is None:
                        found.stray = QuoteSpan(number, field_no)
                    if nxt < 0:
                        if open_span is not None:
                            if row_like or field_no != width:
                                found.swallowed = found.swallowed or open_span
                            open_span, row_like = None, False
                        break
                    pos, field_no = nxt + 1, field_no + 1
                    continue
                if line.startswith(quote, pos):  # a field that starts with the quote: quoted
                    found.first = found.first or QuoteSpan(number, field_no)
                    pos += 1
                    inside = True
                    continue
                nxt = line.find(separator, pos)
                if found.loose is None and quote in (line[pos:] if nxt < 0 else line[pos:nxt]):
                    found.loose = QuoteSpan(number, field_no)
                if nxt < 0:
                    if open_span is not None:  # the record of a multi-line field ends on this line
                        if row_like or field_no != width:
                            found.swallowed = found.swallowed or open_span
                        open_span, row_like = None, False
                    break
                pos, field_no = nxt + 1, field_no + 1
    found.unclosed = open_span
    return found


def _closing_quote(line: str, pos: int, quote: str) -> int:
    """The position of the quote that closes a quoted field from ``pos`` on (``""`` is a quote inside), or -1."""
    while True:
        i = line.find(quote, pos)
        if i < 0:
            return -1
        if line.startswith(quote, i + 1):
            pos = i + 2
            continue
        return i


def quote_column(scan: QuoteScan, span: QuoteSpan, has_header: bool) -> str:
    """A field as the product names it: the header's name, or ``column_N`` without a header."""
    if has_header and span.field <= len(scan.header):
        return f"column {span.field} ('{scan.header[span.field - 1].strip(chr(34))}')"
    return f"column {span.field} ('column_{span.field}')"


NO_QUOTING = "--set data.quote_char=null"


def quote_error(path: Path, separator: str, quote: str, has_header: bool, what: str = "") -> DataError | None:
    """The one-line error of a CSV file that Polars cannot read because of its quotes, or None.

    A quote never closed; a quoted field with text after its closing quote (``"Weird Al" Yankovic``,
    where the quotes are text); else, when the file holds quoted fields at all, Polars' own failure
    (it splits a file into chunks by its quotes) named as a quote problem. Each names the line and
    column and the fix: quotes that are plain text (usual in TSV) are read with ``data.quote_char=null``.
    """
    scan = scan_quotes(path, separator, quote)
    fix = f"if its quotes are plain text (usual in TSV), read it with {NO_QUOTING}"
    if scan.unclosed is not None:
        return DataError(f"{what}'{path}' line {scan.unclosed.line} opens a quoted field ({quote}) that is never "
                         f"closed; close or remove that quote; {fix}")  # fmt: skip
    if scan.stray is not None:
        return DataError(f"cannot read {what}'{path}': line {scan.stray.line}, {quote_column(scan, scan.stray, has_header)}, "
                         f"starts with a quote ({quote}) that closes before the field ends, so the field is not one "
                         f"quoted value; {fix}, or quote the whole field")  # fmt: skip
    spot = min((s for s in (scan.first, scan.loose) if s is not None), key=lambda s: (s.line, s.field), default=None)
    if spot is not None:  # Polars splits a file into chunks by its quotes, and may fail on a quote inside a field
        return DataError(f"cannot read {what}'{path}': its rows cannot be told apart around its quote characters "
                         f"({quote}; the first at line {spot.line}, {quote_column(scan, spot, has_header)}); "
                         f"{fix}")  # fmt: skip
    return None


def swallowed_lines_error(path: Path, separator: str, quote: str, has_header: bool) -> DataError | None:
    """What to say of a CSV file whose quote opens a field that takes in the lines after it, or None.

    Read by the quoting rule, such a file has fewer rows than lines. In a tab-separated file (TSV is not quoted
    by convention: Last.fm, Gowalla, MIND titles hold raw quotes) any multi-line quoted field is this error,
    and the caller refuses the file. In other CSVs a quoted field may span lines (review text, RFC 4180): the
    line is said only of one that holds what looks like a whole row (a text field that merely starts with a
    quote, ``"Heroes``, or review text with a pasted row), and the caller reads the file and warns with it.
    """
    scan = scan_quotes(path, separator, quote)
    span = scan.spans if separator == "\t" else scan.swallowed
    if span is None:
        return None
    where = f"'{path}' line {span.line}, {quote_column(scan, span, has_header)}"
    if separator != "\t":
        return DataError(
            f"{where}, opens a quoted field ({quote}) that spans lines and holds one shaped like a whole row; it is "
            f"read as one field (RFC 4180), so the file has fewer rows than lines; if its quotes are plain text, read "
            f"it with {NO_QUOTING}"
        )
    return DataError(
        f"{where}, opens a quoted field ({quote}) that takes in the lines after it, so this tab-separated file would "
        f"have fewer rows than lines; if its quotes are plain text, read it with {NO_QUOTING}, else close that quote"
    )
