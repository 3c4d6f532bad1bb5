"""Run Python with some top-level packages hidden from the import system (a ``sys.meta_path`` blocker).

Usage (what the tests run in a subprocess, through :func:`run_without`)::

    python tests/without_modules.py torchrec,fbgemm_gpu -m pipelines.cli train ...
    python tests/without_modules.py torchrec,fbgemm_gpu -c "import recsys_alibi.model.transformer"

Importing a hidden package (or any module under it) raises ``ModuleNotFoundError``, as on a
machine where it is not installed; everything else imports as usual.
"""

from __future__ import annotations

import importlib.abc
import os
import runpy
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class HiddenPackages(importlib.abc.MetaPathFinder):
    """Finder placed first on ``sys.meta_path`` that refuses the given top-level packages."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            message = f"No module named '{fullname}' (hidden by tests/without_modules.py)"
            raise ModuleNotFoundError(message, name=fullname)
        return None


def run_without(hidden: str, *argv: str, cwd: Path = REPO, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``python tests/without_modules.py hidden argv...`` (``-m MODULE ...`` or ``-c CODE ...``).

    The repository is on ``PYTHONPATH``, one OpenMP thread; asserts exit code 0 (stderr in the
    message) and returns the finished process (``stdout``/``stderr`` as text).
    """
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, __file__, hidden, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def main(argv: list[str]) -> None:
    names, mode, target, *rest = argv
    sys.meta_path.insert(0, HiddenPackages(set(names.split(","))))
    if mode == "-m":
        sys.argv = [target, *rest]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif mode == "-c":
        sys.argv = ["-c", *rest]
        exec(compile(target, "<without_modules -c>", "exec"), {"__name__": "__main__"})
    else:
        raise SystemExit(f"usage: {sys.argv[0]} PKG[,PKG...] -m MODULE ARGS... | -c CODE ARGS...")


if __name__ == "__main__":
    main(sys.argv[1:])
