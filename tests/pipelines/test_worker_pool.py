"""benchmarks/worker_pool.py: a killed benchmark leaves no worker training behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PARENT = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {benchmarks!r})
    from worker_pool import training_pool

    def train(pid_file, ignore_sigterm):  # stands for a training run: writes its pid, then works for a minute
        if ignore_sigterm:  # as Lightning does: SIGTERM only asks the run to stop at its next batch
            import signal
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(pid_file, "w") as fh:
            fh.write(str(os.getpid()))
        time.sleep(60)

    if __name__ == "__main__":
        with training_pool(1, grace_seconds=2) as (pool, threads):
            future = pool.submit(train, sys.argv[1], sys.argv[2] == "ignore")
            future.result()
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")  # a zombie is gone


def _start_benchmark(tmp_path, sigterm: str = "obey") -> tuple[subprocess.Popen, int]:
    """The benchmark above, started; returns it and its worker's pid once the worker runs."""
    script = tmp_path / "bench.py"
    script.write_text(PARENT.format(benchmarks=str(REPO / "benchmarks")))
    pid_file = tmp_path / "worker.pid"
    parent = subprocess.Popen([sys.executable, str(script), str(pid_file), sigterm])
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    worker = int(pid_file.read_text())
    assert _alive(worker)
    return parent, worker


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _alive(pid)


def test_sigterm_to_the_benchmark_terminates_its_workers(tmp_path):
    parent, worker = _start_benchmark(tmp_path)
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) == 128 + signal.SIGTERM
    assert _gone_within(worker, 10)  # without training_pool the worker sleeps on for a minute


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    parent, worker = _start_benchmark(tmp_path, "ignore")
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) == 128 + signal.SIGTERM  # without the kill the benchmark waits for the worker
    assert _gone_within(worker, 10)


def test_sigkill_to_the_benchmark_ends_its_workers(tmp_path):
    parent, worker = _start_benchmark(tmp_path)
    parent.kill()  # no handler runs: the worker notices that its parent is gone
    assert parent.wait(timeout=30) == -signal.SIGKILL
    assert _gone_within(worker, 15)  # without the watch the worker sleeps on for a minute


NOISY = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {benchmarks!r})
    from worker_pool import training_pool

    def train():  # what Lightning and torchrec print inside a training worker
        import logging, warnings
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated")
        logging.getLogger("lightning.pytorch.utilities.rank_zero").info("GPU available: False, used: False")
        import pytorch_lightning  # MLflow's model loading imports the standalone name, which sets itself to INFO
        logging.getLogger("pytorch_lightning.utilities.rank_zero").info("Tip: try installing litlogger")
        logging.getLogger("recsys_alibi.training").info("trained 3 epochs")
        return 1

    if __name__ == "__main__":
        with training_pool(1) as (pool, threads):
            assert pool.submit(train).result() == 1
    """
)


def test_workers_print_what_the_cli_prints_and_no_third_party_noise(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text(NOISY.format(benchmarks=str(REPO / "benchmarks")))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "trained 3 epochs" in proc.stderr  # the project's INFO lines stay
    assert "LeafSpec" not in proc.stderr and "GPU available" not in proc.stderr and "litlogger" not in proc.stderr
