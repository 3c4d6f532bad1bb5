"""Training runs side by side for the benchmarks: spawned workers that stop with the benchmark.

A ``ProcessPoolExecutor`` outlives its parent: when a benchmark is killed (``kill``, a scheduler's
SIGTERM) or fails, its workers keep training, hold the cores and write into the output folders
that a re-run uses. :func:`training_pool` turns SIGTERM into ``SystemExit`` and, when the block
ends with any exception, terminates the workers before it returns.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor


@contextlib.contextmanager
def training_pool(jobs: int) -> Iterator[tuple[ProcessPoolExecutor, int]]:
    """``jobs`` spawned workers with ``cores // jobs`` torch threads each (at least 1).

    Yields:
        (the pool, torch threads per worker).

    Raises:
        SystemExit: 128 + 15 when the benchmark gets SIGTERM inside the block (workers terminated).
    """
    threads = max(1, (os.cpu_count() or 1) // jobs)
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=set_threads, initargs=(threads,))
    previous = signal.getsignal(signal.SIGTERM)

    def _stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _stop)
    try:
        yield pool, threads
    except BaseException:
        for process in list((pool._processes or {}).values()):  # noqa: SLF001 (no public handle)
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    else:
        pool.shutdown(wait=True)
    finally:
        signal.signal(signal.SIGTERM, previous)


def set_threads(threads: int) -> None:
    """Worker initializer: ``threads`` torch threads per training run (runs share the cores), and the
    CLI's logging (``pipelines.cli.configure_logging``: no Lightning banners, tips or known warnings)."""
    import torch

    from pipelines.cli import configure_logging

    torch.set_num_threads(threads)
    configure_logging()
