"""Training runs side by side for the benchmarks: spawned workers that stop with the benchmark.

A ``ProcessPoolExecutor`` outlives its parent: when a benchmark is killed (``kill``, a scheduler's
SIGTERM) or fails, its workers keep training, hold the cores and write into the output folders
that a re-run uses. :func:`training_pool` turns SIGTERM into ``SystemExit`` and, when the block
ends with any exception, terminates the workers before it returns. A benchmark killed with SIGKILL
runs no handler, so each worker also watches its parent and exits within
:data:`PARENT_CHECK_SECONDS` once the parent is gone (it is then re-parented).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

PARENT_CHECK_SECONDS = 2.0
STOP_GRACE_SECONDS = 30.0  # from SIGTERM to SIGKILL for a worker that does not stop


@contextlib.contextmanager
def training_pool(jobs: int, grace_seconds: float = STOP_GRACE_SECONDS) -> Iterator[tuple[ProcessPoolExecutor, int]]:
    """``jobs`` spawned workers with ``cores // jobs`` torch threads each (at least 1).

    On the way out with an exception the workers get SIGTERM, then SIGKILL after ``grace_seconds``:
    Lightning turns SIGTERM into a stop at the next batch, after which a worker would take the next
    queued run (each run resumes from its last epoch checkpoint, so nothing finished is lost).

    Yields:
        (the pool, torch threads per worker).

    Raises:
        SystemExit: 128 + 15 when the benchmark gets SIGTERM inside the block (workers terminated).
    """
    threads = max(1, (os.cpu_count() or 1) // jobs)
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=start_worker, initargs=(threads, os.getpid()))
    previous = signal.getsignal(signal.SIGTERM)

    def _stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _stop)
    try:
        yield pool, threads
    except BaseException:
        processes = list((pool._processes or {}).values())  # noqa: SLF001 (no public handle)
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        deadline = time.monotonic() + grace_seconds
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
        raise
    else:
        pool.shutdown(wait=True)
    finally:
        signal.signal(signal.SIGTERM, previous)


def start_worker(threads: int, parent_pid: int) -> None:
    """Worker initializer: ``threads`` torch threads per training run (runs share the cores), the
    CLI's logging (``pipelines.cli.configure_logging``: no Lightning banners, tips or known warnings),
    and a daemon thread that ends the worker (exit code 1) when ``parent_pid`` is no longer its
    parent, checked every :data:`PARENT_CHECK_SECONDS` seconds."""
    import torch

    from pipelines.cli import configure_logging

    torch.set_num_threads(threads)
    configure_logging()
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_SECONDS)
    os._exit(1)  # the benchmark was killed without a chance to stop its workers
