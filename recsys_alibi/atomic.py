"""Atomic file writes: write a temporary file beside the target, then rename it into place.

A reader (or a job started again after a kill) sees either the old file or the complete new
one, never half of it. ``os.replace`` is atomic on POSIX within one directory. Several files
that belong together are written into a staging directory and moved into place together, the
commit file last (:func:`publish_files`), or the staging directory takes the place of the old
directory as a whole (:func:`replace_dir`).

Only a regular file is ever replaced. A target that exists and is anything else (a character or
block device such as ``/dev/null``, a FIFO, a socket, a directory) is refused with
:class:`OutputKindError` before anything is written, and checked again just before the rename
(:func:`replace_file`), so that a job run as root never swaps a device node for a Parquet file.
A symbolic link is followed: a link to a regular file (or a dangling link) is written through,
its target replaced or created and the link kept; a link to anything else is refused like its
target.
"""

from __future__ import annotations

import ctypes
import errno
import json
import math
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from recsys_alibi.staging import held_temp, release


_KINDS = ((stat.S_ISDIR, "directory"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
          (stat.S_ISFIFO, "FIFO (named pipe)"), (stat.S_ISSOCK, "socket"))


class OutputKindError(ValueError):
    """An output path that exists and is not of the kind written there (e.g. a device where a file goes)."""


def path_kind(path: str | Path) -> str | None:
    """What ``path`` is, following symbolic links: None when nothing is there (a dangling link, a
    missing parent), else ``"regular file"``, ``"directory"``, ``"character device"``, ``"block device"``,
    ``"FIFO (named pipe)"``, ``"socket"`` or ``"special file"``."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISREG(mode):
        return "regular file"
    return next((name for test, name in _KINDS if test(mode)), "special file")


def describe_path(path: str | Path) -> str:
    """``path``, with its target when it is a symbolic link (for messages)."""
    return f"{path} (a link to {os.path.realpath(path)})" if os.path.islink(path) else str(path)


def check_replaceable(path: str | Path, what: str = "output") -> None:
    """Refuse a file output ``path`` that exists and is not a regular file (after following links).

    Args:
        path: where a file will be written (replaced when it is a regular file).
        what: the flag or config key that named it, for the message.

    Raises:
        OutputKindError: ``path`` is a directory, a device, a FIFO, a socket or another special file.
    """
    kind = path_kind(path)
    if kind is not None and kind != "regular file":
        raise OutputKindError(
            f"{what} {describe_path(path)} is a {kind}, not a regular file, and is never replaced (only regular "
            "files are); remove it or write elsewhere"
        )


def replace_file(source: Path, target: Path) -> None:
    """``os.replace(source, target)`` after :func:`check_replaceable` on ``target`` (the one rename of every writer)."""
    check_replaceable(target)
    os.replace(source, target)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path``; moved onto ``path`` only when the block succeeds.

    The temporary (``.NAME.<token>.tmp``, held by this writer until renamed:
    :mod:`recsys_alibi.staging`) is removed when the block raises; only a hard kill can leave one
    behind (:func:`~recsys_alibi.staging.stale_temps` finds them for a writer that owns ``path``,
    never one of a writer still running). A ``path`` that is a symbolic link (also a dangling
    one) is written through: its target is replaced and the link kept, as a plain
    ``open(path, "w")`` would do.

    Raises:
        OutputKindError: ``path`` (or a link's target) exists and is not a regular file; raised
            before the block runs, so nothing is written.
    """
    check_replaceable(path)
    path = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    tmp, held = held_temp(path)
    try:
        yield tmp
        replace_file(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        release(held)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def json_text(payload: dict, *, sort_keys: bool = True) -> str:
    """``payload`` as indented JSON text (with a final newline), strictly JSON: every JSON file the
    project writes goes through here, so none holds ``NaN`` or ``Infinity`` (Python's ``json``
    writes them bare by default; JSON has no such numbers and strict parsers refuse the file).
    A value that is not measured is ``None`` (``null``) at its source.

    Raises:
        ValueError: a float in ``payload`` is NaN or infinite; the message names its key path.
    """
    try:
        return json.dumps(payload, indent=2, sort_keys=sort_keys, allow_nan=False) + "\n"
    except ValueError:
        where, value = _non_finite(payload)
        raise ValueError(f"{where} is {value}, which JSON cannot hold; it was not written") from None


def _non_finite(value, where: str = "$") -> tuple[str, float] | None:
    """The key path (``$.a.b[2]``) and value of the first NaN or infinite float in ``value``, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, child in children:
        found = _non_finite(child, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}")
        if found is not None:
            return found
    return None


def write_json_atomic(path: str | Path, payload: dict) -> None:
    """Write ``payload`` as indented JSON to ``path`` atomically (:func:`json_text`: no NaN, no Infinity).

    Raises:
        ValueError: a NaN or infinite float in ``payload`` (nothing is written).
    """
    write_text_atomic(path, json_text(payload))


def publish_files(staging: Path, directory: Path, owned: tuple[str, ...], last: str | None = None) -> list[str]:
    """Move the staged files named in ``owned`` into ``directory`` (``last`` moved last); remove
    the ``owned`` files of an earlier writer that this one did not stage.

    A reader that trusts ``last`` as the commit point never pairs it with an older sibling;
    nothing of an earlier run is left to be taken for this one's (e.g. a plot not drawn this time).

    Returns:
        The names moved, in order.

    Raises:
        OutputKindError: one of the ``owned`` names in ``directory`` is not a regular file;
            nothing is moved or removed then.
    """
    names = [n for n in owned if n != last and (staging / n).is_file()]
    if last is not None and (staging / last).is_file():
        names.append(last)
    for name in owned:
        check_replaceable(directory / name)
    for name in owned:
        if name not in names and (directory / name).exists():
            (directory / name).unlink()
    for name in names:
        replace_file(staging / name, directory / name)
    return names


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2  # <fcntl.h>, <linux/fs.h>


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux ``renameat2`` with ``RENAME_EXCHANGE``, glibc 2.28+); False where
    the C library or the file system lacks it. Raises OSError for any other failure."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def replace_dir(source: Path, target: Path) -> None:
    """Put the directory ``source`` at ``target`` as a whole; the old ``target`` directory ends at ``source``
    (the caller removes it: ``source`` lies in a staging directory, :func:`recsys_alibi.staging.staging_dir`).

    A reader of ``target`` sees the old directory or the new one, never a mix of their files: on Linux the two
    are swapped in one ``renameat2(RENAME_EXCHANGE)``; where that is missing the old one is renamed aside into
    ``source``'s folder first, so for a moment there is no ``target``, and a kill then leaves the old directory
    in the staging folder and no ``target`` (a run started again writes it). Both paths must be on one file
    system (``source`` beside ``target``).

    Raises:
        OutputKindError: ``target`` exists and is not a directory (nothing is moved).
    """
    if not os.path.lexists(target):
        os.rename(source, target)
        return
    if not target.is_dir() or target.is_symlink():
        raise OutputKindError(f"output {describe_path(target)} is a {path_kind(target) or 'symbolic link'}, not a "
                              "directory, and is never replaced by one; remove it or write elsewhere")  # fmt: skip
    if _exchange(source, target):
        return
    aside = source.parent / f"{source.name}.previous"
    os.rename(target, aside)
    os.rename(source, target)
    os.rename(aside, source)
