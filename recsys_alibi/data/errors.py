"""Fatal input errors: :class:`DataError`, and the checks that find what is wrong with an input file.

Each check looks at the raw bytes and returns one line naming the file, line or byte at fault and the fix,
or None: a ``.gz`` that does not decompress to its end (:func:`broken_gzip`; Python's ``gzip`` raises
``EOFError`` or ``zlib.error`` there, which are not ``OSError``: every gzip read of an input goes through
:data:`GZIP_ERRORS`), text that is not UTF-8 or is binary, CR-only line ends, an NDJSON line that is not a
JSON object, a Parquet file that cannot be read, a compression or archive that is not read. A reader's
failure is explained by :func:`recsys_alibi.data.read_errors.read_error`, which calls them.
"""

from __future__ import annotations

import ast
import codecs
import gzip
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

import polars as pl

CHUNK = 1 << 20  # bytes read at a time while looking for the broken spot
GZIP_ERRORS = (OSError, EOFError, zlib.error)  # what reading a truncated or corrupt .gz raises (BadGzipFile is an OSError)


class DataError(ValueError):
    """A fatal input problem; the message is one line naming the problem and the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def open_bytes(path: Path):
    """``path`` opened for bytes, through gzip when it is gzipped."""
    return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")


def _chunks(path: Path) -> Iterator[bytes]:
    with open_bytes(path) as fh:
        while chunk := fh.read(CHUNK):
            yield chunk


def is_gzip(path: Path) -> bool:
    """Whether ``path`` is read as gzip (its name ends with ``.gz``, any case)."""
    return path.name.lower().endswith(".gz")


def broken_gzip(path: Path) -> str | None:
    """Why a ``.gz`` file does not decompress to its end (truncated, corrupt), or None (also for other files)."""
    if not is_gzip(path):
        return None
    try:
        for _ in _chunks(path):
            pass
    except GZIP_ERRORS as err:
        return first_line(err)
    return None


def gzip_error(path: Path, problem: str) -> DataError:
    """The one-line error of a ``.gz`` input that does not decompress to its end."""
    return DataError(
        f"cannot read '{path}': a truncated or corrupt gzip file ({problem}); copy it again or remove it from the input"
    )


def invalid_utf8(path: Path) -> tuple[int, int, int] | None:
    """``(line, byte offset, byte value)`` of the first byte of ``path`` that is not UTF-8, or None.

    Lines count from 1, the offset from 0 (in the decompressed text for ``.gz``).
    """
    offset, lines, carry = 0, 1, b""
    for chunk in _chunks(path):
        data = carry + chunk
        try:
            data.decode("utf-8")
            carry = b""
        except UnicodeDecodeError as err:
            if err.reason == "unexpected end of data" and err.start >= len(data) - 3:
                carry = data[err.start :]  # a character cut by the chunk boundary
                data = data[: err.start]
            else:
                return lines + data.count(b"\n", 0, err.start), offset + err.start, data[err.start]
        lines += data.count(b"\n")
        offset += len(data)
    if carry:
        return lines, offset, carry[0]
    return None


class _OutOfRange(ValueError):
    """A valid JSON number that the NDJSON reader cannot hold: its whole file fails to read."""


def _json_number(text: str) -> float:
    """A JSON number as the NDJSON reader takes it: one beyond float64 (``1e400``, 400 digits) fails the read."""
    try:
        number = float(text)
    except OverflowError:  # float(int) of a huge integer
        number = float("inf")
    if number in (float("inf"), float("-inf")):
        raise _OutOfRange(f"{text[:40]}{'...' if len(text) > 40 else ''}")
    return number


def _json_constant(text: str) -> float:
    """``NaN`` / ``Infinity``, which Python's ``json`` reads but JSON (and the NDJSON reader) does not."""
    raise ValueError(f"{text} is not a JSON value")


def bad_ndjson_line(path: Path) -> tuple[int, str] | None:
    """``(line, problem)`` of the first non-blank line of ``path`` that is not a JSON object, or None.

    A UTF-8 byte-order mark before line 1 is named as such: Python's ``json`` skips it, the
    NDJSON reader does not (a BOM is not allowed in JSON text, RFC 8259 section 8.1).
    """
    first_content = True
    with open_bytes(path) as fh:
        for number, raw in enumerate(fh, start=1):
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                strip = "sed '1s/^\\xEF\\xBB\\xBF//'"
                gz = is_gzip(path)
                how = f"zcat '{path}' | {strip} | gzip > NEW.gz" if gz else f"{strip.replace('sed', 'sed -i', 1)} '{path}'"
                return number, f"preceded by a UTF-8 byte-order mark (BOM), which NDJSON does not allow; remove it, e.g. {how}"
            if not raw.strip():
                continue
            whole = _not_json_lines(path, raw) if first_content else None
            if whole is not None:
                return number, whole
            first_content = False
            try:
                value = json.loads(raw, parse_int=_json_number, parse_float=_json_number, parse_constant=_json_constant)
            except _OutOfRange as err:
                return number, f"not readable: its number {err} is beyond the float64 range NDJSON numbers are read in"
            except ValueError as err:  # includes UnicodeDecodeError
                return number, f"not valid JSON ({first_line(err)})"
            if not isinstance(value, dict):
                return number, f"a JSON {type(value).__name__}, not an object"
    return None


WHOLE_FILE = "; the file as a whole is not JSON lines"  # a problem of every line, not of one: no "remove that line"


def _not_json_lines(path: Path, raw: bytes) -> str | None:
    """Why a file whose first non-blank line is ``raw`` is not JSON lines at all, or None: one JSON array or a
    document spread over lines (``[`` or ``{`` alone, pretty-printed), or Python literals (``{'a': 1}``, a
    ``repr`` of dicts: Steam's files) instead of JSON objects. The problem ends with its fix."""
    text = raw.decode("utf-8", "replace").strip().removeprefix("\ufeff")
    name = path.name[:-3] if is_gzip(path) else path.name
    cat = f"zcat '{path}'" if is_gzip(path) else f"cat '{path}'"
    stem = Path(name).stem
    if text.startswith("[") or text == "{":
        try:
            json.loads(text)
            return None if text.startswith("{") else (
                f"one JSON array, not one object per line{WHOLE_FILE} (NDJSON); write each element on a line of its "
                f"own, e.g. {cat} | jq -c '.[]' > '{stem}.jsonl'")  # fmt: skip
        except ValueError:
            pass
        what = "the start of a JSON array" if text.startswith("[") else "the start of a JSON object"
        return (f"{what} spread over several lines{WHOLE_FILE} (NDJSON: one object per line); rewrite it, "
                f"e.g. {cat} | jq -c '{'.[]' if text.startswith('[') else '.'}' > '{stem}.jsonl'")  # fmt: skip
    if text.startswith("{"):
        try:
            json.loads(text)
            return None
        except ValueError:
            pass
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
        if isinstance(value, dict):
            convert = ("python3 -c \"import ast, json, sys; [print(json.dumps(ast.literal_eval(l), default=str)) "
                       f"for l in sys.stdin if l.strip()]\" < '{path}'")  # fmt: skip
            convert = f"{cat} | " + convert.removesuffix(f" < '{path}'")
            return (f"a Python dict literal (quotes ', True/False/None), not a JSON object{WHOLE_FILE}; convert "
                    f"every line, e.g. {convert} > '{stem}.jsonl'")  # fmt: skip
    return None


def bad_parquet_file(paths: list[Path]) -> tuple[Path, str] | None:
    """The first Parquet file that cannot be read whole, or whose schema differs from the first's."""
    reference = None
    for path in paths:
        try:
            if is_gzip(path):
                with gzip.open(path, "rb") as fh:
                    frame = pl.read_parquet(fh.read())
                schema = frame.schema
            else:
                frame = pl.scan_parquet(path, glob=False)  # a resolved path: 'p[1].parquet' is that file
                schema = frame.collect_schema()
                frame.collect(engine="streaming")
        except (pl.exceptions.PolarsError, OSError, ValueError) as err:
            return path, first_line(err)
        if reference is None:
            reference = schema
        elif dict(schema) != dict(reference):
            return path, f"its columns {dict(schema)} differ from those of {paths[0]} {dict(reference)}"
    return None


def _bomless_utf16(head: bytes) -> str | None:
    """``"le"`` / ``"be"`` when ``head`` is ASCII text saved as UTF-16 without a byte-order mark (every odd / even
    byte 0, the others not), else None."""
    even, odd = head[0 : len(head) // 2 * 2 : 2], head[1 : len(head) // 2 * 2 : 2]
    if len(even) < 4:
        return None
    if not odd.strip(b"\x00") and even.strip(b"\x00"):
        return "le"
    if not even.strip(b"\x00") and odd.strip(b"\x00"):
        return "be"
    return None


def not_text(path: Path, what: str = "") -> DataError | None:
    """The one-line error of a file read as text that is not text by its first bytes: a Parquet file, a gzip file
    whose name does not end in ``.gz``, a ``.gz`` file compressed twice, ASCII text saved as UTF-16 without a
    byte-order mark (every other byte 0); else None (also for a ``.gz`` file that does not decompress:
    :func:`broken_gzip` names that)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(4)
        with open_bytes(path) as fh:
            head = fh.read(64)
    except GZIP_ERRORS:
        return None
    order = _bomless_utf16(head)
    if order is not None:
        convert = (f"zcat '{path}' | iconv -f utf-16{order} -t utf-8 | gzip > '{path.name[:-3]}.utf8.gz'"
                   if is_gzip(path) else f"iconv -f utf-16{order} -t utf-8 '{path}' > '{path.stem}.utf8{path.suffix}'")
        return DataError(f"{what}'{path}' looks like UTF-16{order.upper()} text without a byte-order mark (every "
                         f"other byte is 0), not UTF-8: convert it, e.g. {convert}")  # fmt: skip
    if raw.startswith(b"\x1f\x8b") and not is_gzip(path):
        return DataError(f"{what}'{path}' is gzip-compressed but its name does not end in .gz: rename it to "
                         f"'{path.name}.gz' (or decompress it: zcat < '{path}' > '{path.name}.txt')")  # fmt: skip
    if head.startswith(b"PAR1"):
        return DataError(f"{what}'{path}' is a Parquet file (it starts with PAR1), not text: read it as Parquet "
                         "(--format parquet, or a name ending in .parquet)")  # fmt: skip
    if head.startswith(b"\x1f\x8b"):
        return DataError(f"{what}'{path}' was gzip-compressed twice: decompress it once more, e.g. "
                         f"zcat '{path}' | zcat | gzip > '{path.name[:-3]}.once.gz'")  # fmt: skip
    return None


def cr_line_ends(path: Path, what: str = "") -> DataError | None:
    """The one-line error of a text file whose lines end with CR alone (classic Mac OS exports), or None: read by
    lines, it is one line, a header and no rows."""
    try:
        with open_bytes(path) as fh:
            head = fh.read(CHUNK)
    except GZIP_ERRORS:
        return None
    if b"\r" not in head.rstrip(b"\r") or b"\n" in head:
        return None
    fix = (f"zcat '{path}' | tr '\\r' '\\n' | gzip > '{path.name[:-3]}.lf.gz'" if is_gzip(path)
           else f"tr '\\r' '\\n' < '{path}' > '{path.stem}.lf{path.suffix}'")  # fmt: skip
    return DataError(f"{what}'{path}' ends its lines with a carriage return (CR) alone, as classic Mac OS text does, "
                     f"and only LF or CRLF line ends are read; convert them, e.g. {fix}")  # fmt: skip


def not_utf8_error(path: Path, what: str = "") -> DataError | None:
    """The one-line error of a text file (plain or gzip) that is not UTF-8: its line, offset and byte, and the
    ``iconv`` command that converts it, writing beside the file where its folder is writable, else into the
    working directory (a read-only data folder); None when the file is UTF-8. ``what``: a prefix naming the
    file's role (e.g. ``"item table "``)."""
    found = invalid_utf8(path)
    if found is None:
        return None
    line, offset, byte = found
    gz = is_gzip(path)
    plain = Path(path.name[:-3] if gz else path.name)
    converted = f"{plain.stem}.utf8{plain.suffix}" + (".gz" if gz else "")
    target = path.with_name(converted) if os.access(path.parent, os.W_OK) else Path(converted)
    binary = not_text(path, what)
    if binary is not None:
        return binary
    with open_bytes(path) as fh:
        head = fh.read(4)
    utf16 = head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))  # Windows' "Unicode" text
    source = "utf-16" if utf16 else "latin1"
    convert = (
        f"zcat '{path}' | iconv -f {source} -t utf-8 | gzip > '{target}'"
        if gz
        else f"iconv -f {source} -t utf-8 '{path}' > '{target}'"
    )
    kind = "UTF-16 text (it starts with a UTF-16 byte-order mark), not UTF-8" if utf16 else "not UTF-8 text"
    return DataError(
        f"{what}'{path}' is {kind}: byte 0x{byte:02x} at line {line} (offset {offset}); "
        f"convert it to UTF-8 (from its real encoding), e.g. {convert}"
    )


COMPRESSED_MAGIC = {  # the first bytes of the compressed formats that are not read (only gzip is), and their unpacker
    b"BZh": ("bzip2", "bzip2 -dc", ".bz2"),
    b"\xfd7zXZ\x00": ("xz", "xz -dc", ".xz"),
    b"\x28\xb5\x2f\xfd": ("zstd", "zstd -dc", ".zst"),
    b"PK\x03\x04": ("zip", "unzip -p", ".zip"),
    b"7z\xbc\xaf\x27\x1c": ("7z", "7z x -so", ".7z"),
}


def unread_compression(path: Path) -> DataError | None:
    """The one-line error of a file compressed with another tool than gzip (bzip2, xz, zstd, zip, 7z: told by
    its first bytes, whatever its name), or None. Such a file otherwise reads as text that is not UTF-8.
    The command given writes the text beside the working directory whatever the file's name
    (``bunzip2 -k r.csv`` would write ``r.csv.out``)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError:
        return None
    for magic, (kind, unpack, suffix) in COMPRESSED_MAGIC.items():
        if head.startswith(magic):
            name = path.name[: -len(suffix)] if path.name.lower().endswith(suffix) else f"{path.stem}.plain{path.suffix}"
            return DataError(f"cannot read '{path}': it is {kind}-compressed and only gzip (.gz) is read; "
                             f"decompress it first ({unpack} '{path}' > '{name}') or recompress it with gzip")  # fmt: skip
    return tar_archive(path, gzipped=head.startswith(b"\x1f\x8b"))


TAR_MAGIC = b"ustar"  # at offset 257 of a tar header (POSIX and GNU tar)
TAR_MAGIC_AT = 257


def tar_archive(path: Path, gzipped: bool) -> DataError | None:
    """The one-line error of a tar archive (plain, or gzip-compressed under any name: a ``.tar.gz`` renamed
    ``.csv.gz``), told by ``ustar`` at offset 257, or None. Read as text, its headers would be glued to the first
    column name and its members' lines read as rows of one file."""
    try:
        with gzip.open(path, "rb") if gzipped else open(path, "rb") as fh:
            head = fh.read(TAR_MAGIC_AT + len(TAR_MAGIC))
    except GZIP_ERRORS:
        return None
    if head[TAR_MAGIC_AT:] != TAR_MAGIC:
        return None
    kind, flags = ("a gzip-compressed tar archive", "xzf") if gzipped else ("a tar archive", "xf")
    return DataError(f"cannot read '{path}': it is {kind}, not one data file; extract it first (tar {flags} '{path}') "
                     "and read the extracted file or folder instead")  # fmt: skip
