"""Where a command writes: checks made before any work, and one-line messages for write failures.

Every command checks its output path before it reads or trains anything
(:func:`check_output_dir`, :func:`check_output_file`): a path of the wrong kind (``--output``
naming an existing file where a directory is written, a directory where a file is written, or a
device, FIFO or socket, which is never replaced: :func:`recsys_alibi.atomic.check_replaceable`),
a parent that is a file, or a folder that is not writable is an :class:`OutputPathError` (exit
code 2) naming the flag and the fix, so a long job never fails at its last step for a reason known
at its first.

Failures that only show while writing (a disk that fills up, a folder made read-only meanwhile)
reach the command as ``OSError``; :func:`describe_os_error` turns the ones about the output into
one line and an exit code. Every writer of the project writes a temporary file (or directory)
beside its target and renames it into place (:mod:`recsys_alibi.atomic`), so such a failure
leaves each output as it was before the write: old or new, never half of it.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from recsys_alibi.atomic import check_replaceable, describe_path, path_kind
from recsys_alibi.staging import shown_path

EXIT_USER_ERROR = 2
EXIT_FAILURE = 1

USER_FIXABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG}
OUT_OF_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class OutputPathError(ValueError):
    """An output path that cannot be written (wrong kind, parent is a file, not writable); names the fix."""


class GivenPathError(ValueError):
    """A path given to a command (a flag's or config key's value) that no command can use: empty, or a
    symbolic-link loop; names the flag and the fix."""


LOOP_FIX = "remove the link or give another path"


def symlink_loop(path: str | os.PathLike) -> Path | None:
    """The first part of ``path`` (a parent folder, or ``path`` itself) that is a symbolic-link loop
    (``ln -s a b; ln -s b a``: it never reaches a file or folder), or None."""
    path = Path(path)
    for part in (*reversed(path.parents), path):
        try:
            os.stat(part)
        except OSError as err:
            if err.errno == errno.ELOOP:
                return part
    return None


def check_given_path(path: str | os.PathLike | None, flag: str) -> None:
    """Refuse a path given to ``flag`` that is empty (an unset variable: ``--output "$OUT"`` would mean the
    working directory) or is, or goes through, a symbolic-link loop.

    Raises:
        GivenPathError: one line naming ``flag``, the path and the fix.
    """
    if path is None:
        return
    if not str(path).strip():
        raise GivenPathError(f"{flag} is empty (an unset variable?); give a path")
    loop = symlink_loop(path)
    if loop is None:
        return
    where = f"{path} is" if loop == Path(path) else f"{path}: {loop} is"
    raise GivenPathError(f"{flag} {where} a symbolic-link loop; {LOOP_FIX}")


_NEW_FOLDERS: list[Path] = []  # folders the checked outputs would create: missing when checked


def _note_new_folders(folder: Path) -> None:
    """Remember ``folder`` and its missing parents: a refused command removes them again (when empty)."""
    while not os.path.lexists(folder) and folder != folder.parent:
        _NEW_FOLDERS.append(folder)
        folder = folder.parent


def forget_new_folders() -> None:
    """Start a command: no output folder noted yet."""
    _NEW_FOLDERS.clear()


def remove_new_empty_folders() -> list[Path]:
    """After a refused command: remove the folders its output checks found missing, deepest first,
    each only when empty (what the command wrote and its message names, e.g. rejects, stays).

    Returns:
        The folders removed.
    """
    removed = []
    for folder in sorted(set(_NEW_FOLDERS), key=lambda p: len(p.parts), reverse=True):
        try:
            folder.rmdir()
        except OSError:  # not empty, or gone: kept as it is
            continue
        removed.append(folder)
    _NEW_FOLDERS.clear()
    return removed


def _writable_ancestor(path: Path, flag: str) -> Path:
    """The nearest existing folder at or above ``path``'s parent, checked to be a writable directory."""
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputPathError(f"{flag} {path}: {ancestor} is a file, not a directory; choose another path")
    _check_writable(ancestor, path, flag)
    return ancestor


def _check_writable(folder: Path, path: Path, flag: str) -> None:
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(
            f"{flag} {path}: cannot write in {folder} (permission denied or read-only); choose another path "
            "or make that folder writable"
        )


def check_output_dir(path: str | Path, flag: str = "--output") -> Path:
    """Check that ``path`` can become (or be replaced as) an output directory; nothing is created.

    The folders it would create are noted: a command refused later removes them again when empty
    (:func:`remove_new_empty_folders`), so a refused run leaves no empty folder behind.

    Args:
        path: the directory a command will write (created when missing).
        flag: the flag or config key that named it, for the message.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        OutputPathError: ``path`` (resolved) holds a glob character (``*``, ``?``, ``[``), ``path`` exists
            and is not a directory (a file, a device, a FIFO), a parent is a file, the directory (or the nearest existing parent) is not writable, or
            the directory holds a device, FIFO or socket (its files are replaced and read back:
            such an entry is never replaced, and reading a FIFO would wait forever).
    """
    check_given_path(path, flag)
    path = Path(path)
    wildcard = next((ch for ch in "*?[" if ch in str(path.resolve())), None)
    if wildcard is not None:  # its own files are read back by Polars, which takes such a path as a glob
        raise OutputPathError(f"{flag} {path} has the glob character '{wildcard}' in its path, and the files written "
                              "there are read back as a pattern; give a directory path without *, ? or [")  # fmt: skip
    kind = path_kind(path)
    if kind not in (None, "directory") or (kind is None and os.path.lexists(path)):
        kind = (kind or "dangling link").removeprefix("regular ")
        raise OutputPathError(
            f"{flag} {describe_path(path)} is a {kind}, but a directory is written there; "
            "give a directory path (new or existing)"
        )
    _writable_ancestor(path, flag)
    _note_new_folders(path)
    if path.is_dir():
        _check_writable(path, path, flag)
        with os.scandir(path) as entries:
            kinds = [(entry.name, path_kind(entry.path)) for entry in entries]
        special = next(((name, kind) for name, kind in kinds if kind not in (None, "regular file", "directory")), None)
        if special is not None:
            raise OutputPathError(
                f"{flag} {path} holds {special[0]}, a {special[1]}, where a command writes and reads back regular "
                "files; remove it or choose another directory"
            )
    return path


def check_output_file(path: str | Path, flag: str = "--output", example: str = "out.json") -> Path:
    """Check that ``path`` can be written as a file (replaced atomically when it exists).

    ``example`` is the file name the message suggests inside a directory given by mistake.

    Raises:
        OutputPathError: ``path`` is an existing directory, a parent is a file, or the folder it
            goes in is not writable.
        OutputKindError: ``path`` (or a link's target) is a device, a FIFO, a socket: never replaced.
    """
    check_given_path(path, flag)
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(
            f"{flag} {path} is a directory, but a file is written there; give a file path, e.g. {path / example}"
        )
    check_replaceable(path, flag)
    _writable_ancestor(path, flag)
    _note_new_folders(path.parent)  # as check_output_dir: removed again by a refused command when empty
    return path


def _shown_path(filename: str | os.PathLike | None) -> str:
    """The path of an ``OSError``; a temporary beside a target (or a path inside one) names that target
    (:func:`recsys_alibi.staging.shown_path`): messages name only paths the user gave."""
    if filename is None:
        return "the output"
    return str(shown_path(os.fsdecode(filename)))


def describe_error_path(err: OSError) -> str:
    """One line for an ``OSError`` about a path, naming the path the user gave (never a temporary)."""
    reason = err.strerror or str(err) or type(err).__name__
    return reason if err.filename is None else f"{reason}: {_shown_path(err.filename)}"


def as_os_error(err: BaseException) -> OSError | None:
    """``err`` itself when an ``OSError``; for a library error that wraps one in its message
    (Polars writers: ``... No space left on device (os error 28)``), an ``OSError`` of that errno
    when it is a full disk or quota; pathlib's ``RuntimeError`` on a symbolic-link loop as ``ELOOP``;
    else None."""
    if isinstance(err, OSError):
        return err
    loop = re.fullmatch(r"Symlink loop from '(.*)'", str(err)) if isinstance(err, RuntimeError) else None
    if loop is not None:  # pathlib's Path.resolve() on a link loop
        return OSError(errno.ELOOP, os.strerror(errno.ELOOP), loop.group(1))
    found = re.search(r"\(os error (\d+)\)", str(err))
    if found is None:
        return None
    number = int(found.group(1))  # only a full disk: a wrapped error names no path, and reads fail that way too
    return OSError(number, os.strerror(number)) if number in OUT_OF_SPACE else None


def describe_os_error(err: OSError, where: str | os.PathLike | None = None) -> tuple[int, str] | None:
    """``(exit code, one line)`` for an ``OSError`` about a path, or None for any other.

    ``where`` names the path when the error does not (``err.filename`` is None).

    A full disk or quota is exit code 1 (the environment failed; the same command succeeds once
    there is space, a stopped ``score`` resuming its finished shards); a path the user can fix
    (permission, read-only file system, a file where a directory is needed or the reverse) is 2.
    """
    where = _shown_path(err.filename if err.filename is not None else where)
    reason = err.strerror or str(err) or type(err).__name__
    if err.errno in OUT_OF_SPACE:
        return EXIT_FAILURE, (
            f"cannot write {where}: {reason}; what was being written was discarded and every output is as it "
            "was before that write; free space and run the same command again"
        )
    if err.errno == errno.ELOOP:
        return EXIT_USER_ERROR, f"{where} is a symbolic-link loop; {LOOP_FIX}"
    if err.errno in USER_FIXABLE:
        return EXIT_USER_ERROR, f"{reason}: {where}; choose another path or fix its permissions"
    return None
