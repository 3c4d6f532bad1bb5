"""Temporaries beside an output: one unambiguous name per output, held while their writer lives.

Every writer of the project writes a temporary beside its target and renames it into place
(:mod:`recsys_alibi.atomic`): a file for one output file, a staging directory for a set of files
(``export``, the evaluation report). A temporary of the target ``NAME`` is named
``.NAME.<16 hex digits>.tmp``, and nothing else is: the fixed-length token makes the name
unambiguous, so the temporaries of ``ex`` are never taken for those of ``ex.v2`` (``.ex.*.tmp``
matches ``.ex.v2.0a1b....tmp``; ``.ex.<16 hex>.tmp`` does not).

A writer holds an exclusive ``flock`` on its temporary from before it has that name until it is
renamed into place or removed; the kernel releases it when the writer ends, however it ends.
A sweep (:func:`stale_temps`, :func:`remove_stale_temps`) takes only the temporaries of its own
target whose lock it can take: those whose writer is gone (killed). A temporary of a writer still
running, in this process or another, is never touched.

The lock is taken under a name no sweep matches (``.NAME.<token>.new``) and the temporary then
renamed to its ``.tmp`` name, so a sweep never sees a temporary before its lock is held.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

SUFFIX = ".tmp"
_TOKEN_HEX = 16
_PATTERN = re.compile(rf"\.(?P<target>.+)\.[0-9a-f]{{{_TOKEN_HEX}}}{re.escape(SUFFIX)}")
_PENDING = ".new"  # the name a temporary has until its lock is held (held_temp)
_SHOWN_PATTERN = re.compile(rf"\.(?P<target>.+)\.[0-9A-Za-z]+(?:{re.escape(SUFFIX)}|{re.escape(_PENDING)})")


def target_of(name: str) -> str | None:
    """The target name whose temporary ``name`` is (``.NAME.<16 hex>.tmp`` -> ``NAME``), else None."""
    found = _PATTERN.fullmatch(name)
    return None if found is None else found.group("target")


def shown_path(path: str | os.PathLike) -> Path:
    """``path`` as a message shows it: a temporary (``.NAME.<token>.tmp`` or, before its lock is held,
    ``.NAME.<token>.new``), or anything inside one, is shown as its target ``NAME`` beside it.

    Example: ``out/.export.0a1b2c3d4e5f6a7b.tmp/items.parquet`` -> ``out/export``.
    """
    path = Path(path)
    for depth, part in enumerate(path.parts):
        found = _SHOWN_PATTERN.fullmatch(part)
        if found is not None:
            return Path(*path.parts[:depth], found.group("target"))
    return path


def held_temp(target: Path, *, directory: bool = False) -> tuple[Path, int]:
    """Create a temporary of ``target`` beside it (a file, or with ``directory`` a directory), held.

    Returns:
        ``(path, fd)``: the ``.NAME.<token>.tmp`` path and the descriptor that holds its lock;
        close ``fd`` (:func:`release`) only once the temporary is renamed or removed. A file is
        created empty with the usual (umask) permissions.
    """
    token = secrets.token_hex(_TOKEN_HEX // 2)
    pending = target.parent / f".{target.name}.{token}{_PENDING}"  # no sweep matches it while unlocked
    if directory:
        os.mkdir(pending)
        fd = os.open(pending, os.O_RDONLY)
    else:
        fd = os.open(pending, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = target.parent / f".{target.name}.{token}{SUFFIX}"
        os.rename(pending, path)
    except BaseException:
        os.close(fd)
        shutil.rmtree(pending, ignore_errors=True) if directory else pending.unlink(missing_ok=True)
        raise
    return path, fd


def release(fd: int) -> None:
    """Release the lock of a temporary (its writer is done with it)."""
    os.close(fd)


def _is_stale(path: Path) -> bool:
    """Whether no writer holds ``path``'s lock (its writer ended without removing it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # gone meanwhile, or not ours to read
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def stale_temps_in(directory: Path, owns: Callable[[str], bool]) -> list[Path]:
    """The stale temporaries in ``directory`` of the targets whose name ``owns`` accepts, sorted."""
    if not directory.is_dir():
        return []
    found = [directory / name for name in os.listdir(directory) if (target := target_of(name)) is not None and owns(target)]
    return sorted(p for p in found if _is_stale(p))


def stale_temps(target: str | Path) -> list[Path]:
    """The temporaries (files or staging directories) that killed writers of ``target`` left beside it."""
    target = Path(target)
    return stale_temps_in(target.parent, lambda name: name == target.name)


def remove(paths: list[Path]) -> list[Path]:
    """Delete the temporaries ``paths`` (files or directories); returns them."""
    for path in paths:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    return paths


def remove_stale_temps(target: str | Path) -> list[Path]:
    """Delete the temporaries killed writers of ``target`` left (:func:`stale_temps`); returns them."""
    return remove(stale_temps(target))


@contextmanager
def staging_dir(target: str | Path) -> Iterator[Path]:
    """A held staging directory beside ``target`` (``.NAME.<token>.tmp``), removed after the block.

    Stale staging directories of the same ``target`` (killed runs) are removed first; those of
    a run still going, or of any other target, are left alone.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target)
    path, fd = held_temp(target, directory=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        release(fd)
