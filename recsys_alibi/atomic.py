"""Atomic file writes: write a temporary file beside the target, then rename it into place.

A reader (or a job started again after a kill) sees either the old file or the complete new
one, never half of it. ``os.replace`` is atomic on POSIX within one directory.
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


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path``; moved onto ``path`` only when the block succeeds.

    The temporary file is removed when the block raises; only a hard kill can leave a hidden
    ``.NAME.*.tmp`` behind.
    """
    path = Path(path)
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
