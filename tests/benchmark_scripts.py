"""Load a script of ``benchmarks/`` (or any file) as a module: the folder is not a package (a script run puts it
on ``sys.path``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_module(path: Path, name: str) -> ModuleType:
    """The file at ``path`` executed as a fresh module called ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_benchmark(stem: str, name: str | None = None) -> ModuleType:
    """``benchmarks/<stem>.py`` executed as a fresh module called ``name`` (default ``stem``), with ``benchmarks/`` on
    ``sys.path`` as a script run puts it (its sibling modules, e.g. ``run_marker``, import by name)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    return load_module(BENCHMARKS / f"{stem}.py", name or stem)
