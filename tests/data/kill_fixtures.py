"""Run ``prepare`` or an append in a child process that SIGKILLs itself around one ``os.replace``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# kills itself with SIGKILL around the os.replace whose target is named argv[3] ("after" or "before" it),
# in the middle of `{call}(DataConfig(min_events_per_user=argv[5], min_events_per_item=argv[5]), argv[1], argv[2])`
KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    real = os.replace
    def replace(src, dst, *args, **kwargs):
        last = Path(dst).name == sys.argv[3]
        if last and sys.argv[4] == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst, *args, **kwargs)
        if last:
            os.kill(os.getpid(), signal.SIGKILL)
    os.replace = replace
    from recsys_alibi.config import DataConfig
    from recsys_alibi.data.{module} import {call}
    k = int(sys.argv[5])
    {call}(DataConfig(min_events_per_user=k, min_events_per_item=k, overwrite=sys.argv[6] == "1"), sys.argv[1], sys.argv[2])
    """
)


def run_killed(tmp_path: Path, events: Path, out: Path, target: str, when: str, *, append: bool = False, k: int = 1,
               overwrite: bool = False) -> None:  # fmt: skip
    """``prepare`` (or ``append``) ``events`` into ``out`` with k-core ``k`` (and ``data.overwrite``), SIGKILLed
    before/after replacing ``target``."""
    script = tmp_path / "killer.py"
    script.write_text(KILLER.format(module="append", call="append") if append else KILLER.format(module="prepare", call="prepare"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, str(script), str(events), str(out), target, when, str(k), "1" if overwrite else "0"]
    done = subprocess.run(argv, env=env, timeout=300)
    assert done.returncode == -9  # SIGKILL
