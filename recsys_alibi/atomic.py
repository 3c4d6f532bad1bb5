"""Atomic file writes: write a temporary file beside the target, then rename it into place.

A reader (or a job started again after a kill) sees either the old file or the complete new
one, never half of it. ``os.replace`` is atomic on POSIX within one directory. Several files
that belong together are written into a staging directory and moved into place together, the
commit file last (:func:`publish_files`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _temp_beside(path: Path) -> Path:
    """An empty hidden temporary file in the directory of ``path``, with the usual (umask) permissions."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    return Path(tmp)


def stale_temps(path: str | Path) -> list[Path]:
    """The hidden ``.NAME.*.tmp`` files that killed writers of ``path`` left beside it."""
    path = Path(path)
    return [p for p in path.parent.glob(f".{path.name}.*.tmp") if p.is_file()]


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path``; moved onto ``path`` only when the block succeeds.

    The temporary file is removed when the block raises; only a hard kill can leave a hidden
    ``.NAME.*.tmp`` behind (:func:`stale_temps` finds them for a writer that owns ``path``).
    A ``path`` that is a symbolic link (also a dangling one) is written through: its target is
    replaced and the link kept, as a plain ``open(path, "w")`` would do.
    """
    path = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    tmp = _temp_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json_atomic(path: str | Path, payload: dict) -> None:
    """Write ``payload`` as indented JSON to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def publish_files(staging: Path, directory: Path, owned: tuple[str, ...], last: str | None = None) -> list[str]:
    """Move the staged files named in ``owned`` into ``directory`` (``last`` moved last); remove
    the ``owned`` files of an earlier writer that this one did not stage.

    A reader that trusts ``last`` as the commit point never pairs it with an older sibling;
    nothing of an earlier run is left to be taken for this one's (e.g. a plot not drawn this time).

    Returns:
        The names moved, in order.
    """
    names = [n for n in owned if n != last and (staging / n).is_file()]
    if last is not None and (staging / last).is_file():
        names.append(last)
    for name in owned:
        if name not in names and (directory / name).exists():
            (directory / name).unlink()
    for name in names:
        os.replace(staging / name, directory / name)
    return names
