"""Several scoring processes on one job: who am I, wait for the others, share small objects.

The scoring job splits its shards across the processes of a ``torch.distributed`` group: rank
``r`` of ``W`` takes shards ``r, r + W, r + 2W, ...``. The group is

- the one already initialised by the caller (a test that spawns processes, Lightning), or
- created here from the ``torchrun`` environment (``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``,
  ``MASTER_PORT``) with the ``gloo`` backend (CPU; the scoring itself may still run on a GPU),
  and destroyed again when the job ends, or
- none: a single process (``World(0, 1)``), where every collective is a no-op.

Only small Python objects travel (manifest state, error messages, counts): scoring needs no
tensor communication.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

log = logging.getLogger(__name__)

GROUP_TIMEOUT = datetime.timedelta(hours=2)  # staging a raw event log on rank 0 can take long


@dataclass(frozen=True)
class World:
    """This process's place in the scoring group.

    Attributes:
        rank: 0-based index of this process.
        size: number of processes (1: no group).
    """

    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        """True on rank 0, which writes the manifest and prints progress."""
        return self.rank == 0

    def shards(self, n_shards: int) -> range:
        """The shards of this rank: ``rank, rank + size, ...`` below ``n_shards``."""
        return range(self.rank, n_shards, self.size)

    def barrier(self) -> None:
        """Wait until every rank got here (no-op for one process)."""
        if self.size > 1:
            dist.barrier()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (pickled; small objects only)."""
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def run_on_main(self, fn, *args, **kwargs) -> Any:
        """Run ``fn`` on rank 0 only and hand its result, or its exception, to every rank.

        An exception on rank 0 is raised on every rank (same type when it can be rebuilt from
        its message, else ``RuntimeError``), so no rank is left waiting at a barrier.
        """
        result: Any = None
        error: BaseException | None = None
        if self.is_main:
            try:
                result = fn(*args, **kwargs)
            except Exception as err:  # handed to the other ranks, then raised here too
                error = err
        if self.size > 1:
            result, error_info = self.broadcast(
                (result, None if error is None else (type(error), str(error)))
            )
            if error is None and error_info is not None:
                kind, message = error_info
                try:
                    error = kind(message)
                except Exception:  # exotic constructor: keep the message
                    error = RuntimeError(message)
        if error is not None:
            raise error
        return result


def launched_size(env: dict[str, str] | None = None) -> int:
    """The processes a launcher started for this job (``WORLD_SIZE`` of torchrun; 1 without one)."""
    return int((os.environ if env is None else env).get("WORLD_SIZE", "1"))


@contextmanager
def scoring_world() -> Iterator[World]:
    """The :class:`World` of this process for the duration of a job.

    Uses an initialised default process group; else creates one (gloo) when ``WORLD_SIZE > 1``
    (e.g. under ``torchrun --nproc-per-node 2``) and destroys it on exit; else one process.

    Raises:
        RuntimeError: ``WORLD_SIZE > 1`` but the rendezvous variables are missing or the
            group cannot form (torch's error, with its message).
    """
    if dist.is_available() and dist.is_initialized():
        yield World(dist.get_rank(), dist.get_world_size())
        return
    size = launched_size()
    if size <= 1 or not dist.is_available():
        yield World()
        return
    dist.init_process_group("gloo", timeout=GROUP_TIMEOUT)
    try:
        world = World(dist.get_rank(), dist.get_world_size())
        log.debug("scoring group formed: rank %d of %d", world.rank, world.size)
        yield world
    finally:
        dist.destroy_process_group()
