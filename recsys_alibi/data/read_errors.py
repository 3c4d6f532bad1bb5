"""A reader's failure turned into one line naming the culprit: which file, line or byte, and what to do.

A Polars reader that fails names the problem in its own words ("invalid utf-8 sequence",
"Syntax at character 37") and, for several files, often the first file rather than the broken
one. :func:`read_error` looks again, only on that failure path:

* any format: a ``.gz`` file that does not decompress to its end (truncated or corrupt), first;
* Parquet: the first file whose footer or data cannot be read, or whose schema differs from the
  first file's;
* text that is not UTF-8: the file, line and byte of the first invalid byte, and how to convert it;
* CSV: a quote problem (:mod:`recsys_alibi.data.quotes`);
* NDJSON: the file and line of the first line that is not a JSON object.
"""

from __future__ import annotations

from pathlib import Path

from recsys_alibi.data.errors import WHOLE_FILE, DataError, bad_ndjson_line, bad_parquet_file, broken_gzip, first_line, gzip_error, not_utf8_error
from recsys_alibi.data.quotes import quote_error


def read_error(paths: list[Path] | tuple[Path, ...], fmt: str, err: BaseException, fix: str, what: str = "", *,
               separator: str | None = None, quote: str | None = '"', has_header: bool = True) -> DataError:  # fmt: skip
    """A one-line DataError for a reader failure, naming the file (and line or byte) at fault.

    Args:
        separator, quote, has_header: how a CSV was read (its quotes are looked at by the same rule).
        paths: the input files, in reading order.
        fmt: the format they were read as.
        err: what the reader raised.
        fix: advice to end the message with when nothing more precise is found.
        what: what the files are, put before each file's name ("item table "; empty for events).
    """
    paths = list(paths)
    for path in paths:  # a .gz cut short (an interrupted copy) is the most likely cause, whatever the format
        problem = broken_gzip(path)
        if problem is not None:
            return gzip_error(path, problem)
    if fmt == "parquet":
        found = bad_parquet_file(paths)
        if found is not None:
            return DataError(f"cannot read {what}'{found[0]}' as parquet: {found[1]}; check or remove that file")
        return DataError(f"cannot read {what}'{paths[0]}' as {fmt}: {first_line(err)}; {fix}")
    for path in paths:  # text formats: an encoding problem first, it is the most common
        encoding = not_utf8_error(path, what)
        if encoding is not None:
            return encoding
    if fmt == "csv" and quote is not None:
        for path in paths:
            quoted = quote_error(path, separator or ",", quote, has_header, what)
            if quoted is not None:
                return quoted
    if fmt == "ndjson":
        for path in paths:
            found_line = bad_ndjson_line(path)
            if found_line is not None:
                fix = "" if WHOLE_FILE in found_line[1] else "; fix or remove that line"
                return DataError(f"{what}'{path}' line {found_line[0]} is {found_line[1]}{fix}")
    return DataError(f"cannot read {what}'{paths[0]}' as {fmt}: {first_line(err)}; {fix}")
