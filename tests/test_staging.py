"""Temporaries beside an output (recsys_alibi.staging): unambiguous per output, swept only when their writer is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from recsys_alibi.atomic import atomic_path
from recsys_alibi.staging import held_temp, release, remove_stale_temps, stale_temps, staging_dir, target_of


def _killed_writer(target: Path, directory: bool) -> Path:
    """A temporary of ``target`` whose writer (another process) was killed with SIGKILL while holding it."""
    code = ("import sys, time; from pathlib import Path; from recsys_alibi.staging import held_temp; "
            f"path, fd = held_temp(Path({str(target)!r}), directory={directory}); print(path, flush=True); time.sleep(60)")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    path = Path(proc.stdout.readline().strip())
    assert path.exists() and path not in stale_temps(target)  # its writer still runs: not stale
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    return path


def test_names_are_unambiguous_per_output():
    token = "0123456789abcdef"
    assert target_of(f".ex.{token}.tmp") == "ex"
    assert target_of(f".ex.v2.{token}.tmp") == "ex.v2"
    assert target_of(f".ex.{token}.{token}.tmp") == f"ex.{token}"
    for name in (".ex.abc.tmp", f".ex.{token}.new", f"ex.{token}.tmp", f".ex.{token.upper()}.tmp", ".report-x1.tmp"):
        assert target_of(name) is None, name


def test_only_temporaries_of_the_same_output_whose_writer_is_gone_are_swept(tmp_path):
    killed_file = _killed_writer(tmp_path / "ex", directory=False)
    killed_dir = _killed_writer(tmp_path / "ex", directory=True)
    other = _killed_writer(tmp_path / "ex.v2", directory=True)  # killed, but another output's
    live, fd = held_temp(tmp_path / "ex", directory=True)  # a writer of ex still running (this process)
    assert stale_temps(tmp_path / "ex") == sorted([killed_file, killed_dir])
    with staging_dir(tmp_path / "ex") as staging:
        assert staging.parent == tmp_path and target_of(staging.name) == "ex" and staging != live
        assert not killed_file.exists() and not killed_dir.exists()
    assert not staging.exists() and live.is_dir() and other.is_dir()
    release(fd)
    assert remove_stale_temps(tmp_path / "ex") == [live] and not live.exists()
    assert other.is_dir() and stale_temps(tmp_path / "ex.v2") == [other]


def test_atomic_write_holds_its_temporary_until_renamed(tmp_path):
    target = tmp_path / "out.parquet"
    with atomic_path(target) as tmp:
        tmp.write_text("x")
        assert target_of(tmp.name) == "out.parquet" and stale_temps(target) == []  # held while written
    assert target.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet"]
