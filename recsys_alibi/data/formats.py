"""Which files an input names and which format they are in (read from names and first lines only).

* :func:`resolve_paths`: a file, a directory (every file below it, hidden ones and ``_``-prefixed
  ones skipped: a Spark folder's ``_SUCCESS`` and ``.part-*.crc``; so is a dataset's documentation,
  ``README.txt``, ``LICENSE``, ``*.md``, ``*.pdf``: :func:`is_documentation`) or a glob (only when nothing has
  that exact name, :func:`is_glob`) -> files in natural
  name order (``day9`` before ``day10``), the order their lines are read in. The one rule of every
  reader of a user-given file or folder (events, ``score.allow`` / ``score.deny``): a path that is
  not a regular file or directory (a FIFO, a socket, a device), given or found in the folder, is
  refused with one line saying what it is and why (:func:`not_a_file`), never reported missing
  or skipped silently.
* :func:`infer_format`: the format from the first file's name, else from its first lines.
"""

from __future__ import annotations

import glob
import gzip
import logging
import os
import re
from pathlib import Path

from recsys_alibi.atomic import describe_path, path_kind
from recsys_alibi.data.errors import GZIP_ERRORS, DataError, first_line, gzip_error

log = logging.getLogger(__name__)

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


def not_a_file(path: Path, what: str = "input", flag: str = "--input", takes: str = "file, directory or glob") -> DataError:
    """The error for a user-given ``path`` that is not a regular file or directory: what is there and why
    it is refused (a FIFO is read once, an input more than once), or that nothing is there."""
    kind = path_kind(path)
    if kind is None:
        dangling = f" (a symbolic link to the missing {os.path.realpath(path)})" if os.path.islink(path) else ""
        return DataError(f"{what} not found: '{path}'{dangling}; pass an existing {takes} as {flag}")
    why = ("a pipe can be read only once, and an input is read more than once (its format is sniffed, then it is "
           "read in passes): write it to a file first") if kind.startswith("FIFO") else \
        "only regular files are read as input"  # fmt: skip
    accepted = "regular file or directory" if "directory" in takes else "regular file"  # an item table: a file
    return DataError(f"{what} '{describe_path(path)}' is a {kind}, not a {accepted}: {why} ({flag})")


def _regular(paths: list[Path], what: str, flag: str) -> list[Path]:
    """``paths`` (found below a folder or by a glob) but directories; any other non-regular file refused."""
    special = next((p for p in paths if path_kind(p) not in ("regular file", "directory")), None)
    if special is not None:
        raise not_a_file(special, what, flag)
    return [p for p in paths if p.is_file()]


def is_glob(path: str | Path) -> bool:
    """Whether ``path`` is read as a glob: it has ``*``, ``?`` or ``[`` and nothing has that exact name.

    A file, folder or link named ``we[1].csv`` is that file (as a glob it would read ``we1.csv``,
    another file), so a path that exists is always taken literally.
    """
    text = str(path)
    return any(ch in text for ch in "*?[") and not os.path.lexists(text)


def literal(path: str | Path) -> str:
    """``path`` for a Polars reader that always expands globs (``scan_ndjson``, ``read_ndjson``): the
    characters ``*?[`` escaped, so an existing ``we[1].ndjson`` is read and not ``we1.ndjson``.
    Every other Polars reader of a resolved path is given ``glob=False``."""
    return glob.escape(str(path))


def resolve_paths(input_path: str | Path, what: str = "input", flag: str = "--input") -> list[Path]:
    """The files behind a file, directory (all files below it, hidden and ``_``-prefixed ones skipped) or glob.

    A path that exists is taken literally, whatever its characters; only one that does not is a
    glob (:func:`is_glob`).

    Several files are returned in natural order (:func:`natural_key`: ``day9, day10, day11``),
    which is also the order their lines are read in, so line-order time follows it.

    Args:
        what, flag: how messages name the input and the flag or key that gave it (``score.allow``).

    Raises:
        DataError: nothing there, no file in the folder or matching the glob, or a path (given, or
            a visible one in the folder or the glob's matches) that is a FIFO, socket or device
            (:func:`not_a_file`).
    """
    text = str(input_path)
    if is_glob(text):
        paths = sorted(_regular([Path(p) for p in glob.glob(text, recursive=True)], what, flag), key=natural_key)
        if not paths:
            raise DataError(f"no file is named '{text}' and no files match it as a glob pattern; check the path given as {flag}")
        return paths
    path = Path(text)
    if path.is_dir():
        visible = [p for p in path.rglob("*") if not any(part.startswith((".", "_")) for part in p.relative_to(path).parts)]
        paths = sorted(_regular(visible, what, flag), key=natural_key)
        docs = [p for p in paths if is_documentation(p)]
        if docs and len(docs) < len(paths):  # a dataset folder's README.txt is no data (nor its format)
            log.info("%s: skipping %d documentation file(s) (%s)", path, len(docs), ", ".join(p.name for p in docs[:3]))
            paths = [p for p in paths if not is_documentation(p)]
        if not paths:
            raise DataError(f"empty {what}: directory '{path}' holds no files; point {flag} at its files")
        return paths
    if not path.is_file():
        raise not_a_file(path, what, flag)
    return [path]


# names of a dataset's lookup tables (items, users, id mappings): MovieLens u.item / movies.dat / tags.csv,
# SASRec's sas_to_original_items.txt; matched on the lower-case file name up to its first dot after the stem
LOOKUP_TABLE_NAME = re.compile(
    r"^(u\.(item|user|genre|info|occupation)|(movies|items?|users?|tags|links|genres?|genome[-_]\w+)"
    r"|[^.]*(_to_|mapping|metadata|vocab|features)[^.]*)(\.|$)"
)


def check_no_lookup_tables(input_path: str | Path, paths: list[Path]) -> None:
    """Refuse an input folder whose files are an event log beside lookup tables named as such (``movies.dat``,
    ``u.item``, ``sas_to_original_items.txt``): a folder is read as one event log, so their rows would become
    events, silently where they parse in the log's format. A folder of such tables only, or of log parts, passes.

    Raises:
        DataError: naming the tables and the event log to point ``--input`` at.
    """
    if isinstance(input_path, (list, tuple)) or not Path(input_path).is_dir():
        return
    tables = [p for p in paths if LOOKUP_TABLE_NAME.match(p.name.lower())]
    if not tables or len(tables) == len(paths):
        return
    logs = [p for p in paths if p not in tables]
    names = ", ".join(p.name for p in tables[:6]) + (", ..." if len(tables) > 6 else "")
    which = f"'{logs[0]}'" if len(logs) == 1 else "one of " + ", ".join(f"'{p.name}'" for p in logs[:3])
    raise DataError(f"'{input_path}' holds tables that are not events beside the event log ({names}), and a folder "
                    f"is read as one log: point --input at the event log ({which}), or move those tables out of it")


DOC_NAMES = ("readme", "license", "licence", "copying", "notice", "changelog", "citation")  # name starts, any case
DOC_SUFFIXES = (".md", ".rst", ".pdf", ".html", ".htm")


def is_documentation(path: Path) -> bool:
    """Whether a file found in an input folder is a dataset's documentation (``README.txt``, ``LICENSE``,
    ``*.md``, ``*.pdf``), not data: skipped there, so neither read as events nor used to infer the format."""
    name = path.name.lower()
    return name.startswith(DOC_NAMES) or name.endswith(DOC_SUFFIXES)


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


def format_reason(path: Path, fmt: str) -> str:
    """How :func:`infer_format` chose ``fmt`` for ``path``: from its name (naming the suffix) or its first lines."""
    name, _ = stem_suffix(path)
    suffix = next((s for s in NAMED_SUFFIXES if name.endswith(s)), None)
    if name == "u.data":
        return "from its name (u.data)"
    return f"from its name ({suffix})" if suffix is not None else "from its first lines"


NAMED_SUFFIXES = (".parquet", ".pq", ".csv", ".tsv", ".ndjson", ".jsonl", ".json", ".dat")  # formats told by name


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
    lines = [ln.strip() for ln in head.decode("utf-8", "replace").removeprefix("\ufeff").splitlines()[:SNIFF_LINES]]
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
        table = table_refusal(path, lines, widths)
        if table is not None:
            raise table
        return "s3rec"
    if header_separator(lines[0]) is not None:
        return "csv"
    table = table_refusal(path, lines, widths) if len(widths) == 1 else None  # spaces, with decimals ("3.5") or text
    if table is not None:
        raise table
    raise DataError(f"cannot infer the format of '{path}'; {FORMAT_HELP}")


def table_refusal(path: Path, lines: list[str], widths: set[int]) -> DataError | None:
    """The refusal of a whitespace-separated table that the sniffing rule would read as S3-Rec, or None.

    S3-Rec lines (``user item item ...``) vary in length and are space-separated; a file whose
    sniffed lines all have the same number (>= 3) of fields, or any tab-separated one (4 tab
    fields are ``u.data``, read before), is a table (``user item rating [timestamp]``: Epinions,
    FilmTrust, Douban, Yahoo R3): read as S3-Rec, its ratings and timestamps would become items.
    """
    tabbed = any("\t" in ln for ln in lines)
    if not tabbed and (len(widths) != 1 or min(widths) < 3):
        return None
    width = max(widths)
    setting = "data.separator=tab" if tabbed else "\"data.separator=' '\""
    shape = f"{width} fields on every line" if len(widths) == 1 else "tab-separated fields"
    if all(is_number(tok) for tok in lines[0].split()):  # no header: the columns are named by position
        header, names = " --set data.has_header=false", ("column_1", "column_2", "column_N")
    else:  # a header of names: the columns are mapped by them
        header, names = "", ("USER_COLUMN", "ITEM_COLUMN", "TIME_COLUMN")
    return DataError(
        f"cannot infer the format of '{path}': it looks like a table ({shape}, e.g. {lines[0][:60]!r}), not S3-Rec "
        "(one sequence of varying length per line), so it is not read as one; read it as a table with --format csv "
        f"--set {setting}{header} and map the columns{' by position' if header else ' by the header'} (--set "
        f"data.columns.user_id={names[0]} --set data.columns.item_id={names[1]} --set data.columns.timestamp="
        f"{names[2]}, or =null for line order), or pass --format s3rec if each line really is one user's item sequence"
    )


def is_number(text: str) -> bool:
    """Whether ``text`` reads as a number (``float``): a value, not a name, in a header line."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def header_separator(line: str) -> str | None:
    """The first of ``SEPARATORS`` found in a header line, or None."""
    return next((sep for sep in SEPARATORS if sep in line), None)


def is_movielens_csv(head: str) -> bool:
    """Whether a file's first line is the GroupLens ``ratings.csv`` header (any case)."""
    lines = head.removeprefix("\ufeff").splitlines()  # a UTF-8 byte-order mark is no part of the header
    return bool(lines) and lines[0].strip().lower() == MOVIELENS_CSV_HEADER
