"""Which files an input names and which format they are in (read from names and first lines only).

* :func:`resolve_paths`: a file, a directory (every file below it, hidden ones and ``_``-prefixed
  ones skipped) or a glob -> files in natural name order (``day9`` before ``day10``), the order
  their lines are read in.
* :func:`infer_format`: the format from the first file's name, else from its first lines.
"""

from __future__ import annotations

import glob
import gzip
import re
from pathlib import Path

from recsys_alibi.data.errors import GZIP_ERRORS, DataError, first_line, gzip_error

FORMATS = ("parquet", "csv", "ndjson", "movielens", "sasrec", "s3rec")
SNIFF_LINES = 200  # lines read to infer a text format
MOVIELENS_CSV_HEADER = "userid,movieid,rating,timestamp"  # GroupLens ml-latest / ml-20m / ml-25m / ml-32m ratings.csv
SEPARATORS = (",", "\t", ";", "|")  # CSV separators recognised in a header line, in this order
FORMAT_HELP = "pass --format " + "|".join(FORMATS)


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


def stem_suffix(path: Path) -> tuple[str, bool]:
    """The name without ``.gz`` (lower case) and whether it was gzip-compressed."""
    name = path.name.lower()
    return (name[:-3], True) if name.endswith(".gz") else (name, False)


def head_bytes(path: Path, n: int = 1 << 16) -> bytes:
    opener = gzip.open if stem_suffix(path)[1] else open
    try:
        with opener(path, "rb") as fh:
            return fh.read(n)
    except GZIP_ERRORS as err:  # permissions; a truncated or corrupt .gz (EOFError, zlib.error)
        if stem_suffix(path)[1]:
            raise gzip_error(path, first_line(err)) from None
        raise DataError(f"cannot read '{path}': {first_line(err)}; check the file") from None


def infer_format(paths: list[Path]) -> str:
    """Guess the format from the first file's name, then from its first lines."""
    path = paths[0]
    name, _ = stem_suffix(path)
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".csv", ".tsv")):
        return "movielens" if is_movielens_csv(head_bytes(path, 256).decode("utf-8", "replace")) else "csv"
    if name.endswith((".ndjson", ".jsonl", ".json")):
        return "ndjson"
    if name.endswith(".dat") or name == "u.data":
        return "movielens"
    head = head_bytes(path)
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
    if header_separator(lines[0]) is not None:
        return "csv"
    raise DataError(f"cannot infer the format of '{path}'; {FORMAT_HELP}")


def header_separator(line: str) -> str | None:
    """The first of ``SEPARATORS`` found in a header line, or None."""
    return next((sep for sep in SEPARATORS if sep in line), None)


def is_movielens_csv(head: str) -> bool:
    """Whether a file's first line is the GroupLens ``ratings.csv`` header (any case)."""
    lines = head.splitlines()
    return bool(lines) and lines[0].strip().lower() == MOVIELENS_CSV_HEADER
