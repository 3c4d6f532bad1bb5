"""``recsys-alibi score --engine ray``: the scoring job with its shards scored by a Ray Data actor pool.

    recsys-alibi score --engine ray --model-uri models:/recsys-alibi-ranker@champion \\
        --input prepared/ --output rankings/ --set score.ray.actors=8 --set score.ray.gpus_per_actor=1

Python: :func:`serving.engines.run_score` with ``score.engine=ray`` (a model URI) or
:func:`score_with_ray` (a model in memory).

The job is ``score``'s (:mod:`serving.score`): the driver opens the output directory and its
manifest, stages and checks the input (:func:`serving.inputs.open_input`) and fixes the plan of
shards of ``score.shard_users`` users; what changes is who scores the shards that are not done.
They become a Ray Dataset of shard indices, and ``map_batches`` runs them over an actor pool of
``score.ray.actors`` actors (``cpus_per_actor`` / ``gpus_per_actor`` each). Every actor holds one
copy of the model (shipped once through the object store) and, per shard, calls
:func:`serving.score.write_shard`: it reads the shard's users from the sequences Parquet
(``ScoreInput.read_shard``, a Parquet slice), ranks them with :class:`serving.rank.ShardRanker`
and writes ``part-NNNNN.parquet`` atomically. The driver records each shard in ``_manifest.json``
as its result streams back. So the rankings are the same rows as ``score``'s, the same part
files, and the resume rules of :mod:`serving.manifest` hold unchanged: a job killed at any
moment and run again skips the recorded shards, rewrites a part that was in place but not
recorded, and completes with exactly the output of an uninterrupted run. A shard whose actor
dies is retried by Ray Data (its actor pools restart dead actors and retry their tasks); an error
in the input stops the job with its one-line message.

Why the actors read their own slices rather than the driver handing them rows from
``ray.data.read_parquet``: a shard is a contiguous run of rows, and Ray Data has neither a row
index nor blocks aligned with a fixed number of rows, so grouping rows into shards needs an
all-to-all shuffle. That shuffle (``groupby("shard").map_groups``) never finished on a 2-CPU
local instance: its read tasks waited for CPUs the actors held (docs/scaling.md).

Ray runs loopback only when this job starts it (``score.ray.address`` unset: a local instance
whose every process listens on 127.0.0.1, without dashboard, ignoring ``RAY_ADDRESS``, ended with
the job even when the driver is killed: :mod:`serving.ray_instance`); with an address it joins
that cluster (checked to answer first), and every node must read the input and write the output
directory (shared storage). Ray's own logs and progress bars are kept out of the command's output.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl

from recsys_alibi.config import ConfigError, JobConfig, RayConfig, ScoreConfig
from recsys_alibi.data.ingest import DataError
from serving.distributed import World
from serving.inputs import ScoreInput
from serving.manifest import SHARD_STATS, OutputDirError, part_name
from serving.rank import ShardRanker, device_identity
from serving.ray_instance import import_ray, loopback_env, ray_instance  # noqa: F401 (loopback_env: tests)
from serving.score import ScoreJobResult, _ScoreJob, score_with_model, write_shard

log = logging.getLogger(__name__)

_USER_ERRORS = {"DataError": DataError, "OutputDirError": OutputDirError, "ConfigError": ConfigError}


class ShardActor:
    """One actor of the pool: a model and a ranker; ``__call__`` scores a batch of shard indices.

    Args:
        model: the ``AlibiRanker`` or a Ray object reference to it (fetched once here).
        items: the model's vocabulary; score: the ``score`` section; k: items per user.
        source: the job's staged input; output_dir: the rankings directory (both readable and
            writable from the actor's node).
        threads: torch threads of this actor; carry: ``score.changed_since``'s previous output (or None).
        popularity: the driver ranker's item popularity (``score.popularity_prior``), or None.
    """

    def __init__(self, model, items: pl.DataFrame, score: ScoreConfig, k: int, source: ScoreInput,
                 output_dir: Path, threads: int, carry=None, popularity: pl.DataFrame | None = None) -> None:  # fmt: skip
        import ray
        import torch

        torch.set_num_threads(max(1, threads))
        if isinstance(model, ray.ObjectRef):
            model = ray.get(model)
        self.ranker = ShardRanker(model, items, score, k, popularity)
        self.source, self.output_dir, self.shard_users, self.carry = source, Path(output_dir), score.shard_users, carry

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``{"shard": (S,)}`` -> the shards' stats (S,) each, part files written.

        A user error (``ValueError``: bad input) is returned as ``error`` / ``error_type`` rather
        than raised, so the driver can raise it as the one-line error it is (Ray would wrap it
        in a task error with the actor's traceback, and retrying it would not help).
        """
        out: dict[str, list] = {key: [] for key in ("shard", *SHARD_STATS, "error", "error_type")}
        for shard in batch["shard"]:
            try:
                stats = write_shard(self.ranker, self.source, int(shard), self.shard_users, self.output_dir, self.carry)[1]
                error = ("", "")
            except ValueError as err:
                stats, error = dict.fromkeys(SHARD_STATS, 0), (str(err).strip().splitlines()[0], type(err).__name__)
            out["shard"].append(int(shard))
            for key in SHARD_STATS:
                out[key].append(stats[key])
            out["error"].append(error[0])
            out["error_type"].append(error[1])
        return {key: np.asarray(values, dtype=object if key.startswith("error") else np.int64)
                for key, values in out.items()}  # fmt: skip


class _RayScoreJob(_ScoreJob):
    """``score``'s job with :meth:`_score_todo` run by an actor pool (the driver records the shards)."""

    def __init__(self, *args, model, ray_cfg: RayConfig, **kwargs) -> None:
        self.model, self.ray_cfg = model, ray_cfg  # first: the identity reads ray_cfg (engine_settings)
        super().__init__(*args, **kwargs)

    def engine_settings(self) -> dict:
        return {"device": actor_device(self.config.score, self.ray_cfg)}

    def _score_todo(self, source: ScoreInput, todo: list[int], advance: Callable[[int], None]) -> int:
        if not todo:
            return 0
        ray = import_ray()
        cfg = self.ray_cfg
        actors = min(cfg.actors, len(todo))
        # absolute paths: a cluster's workers run in the folder `ray start` ran in, not this process's
        carry = self.carry if self.carry is None else replace(self.carry, previous=self.carry.previous.absolute())
        kwargs = {"model": self.model, "items": self.items, "score": self.config.score, "k": self.ranker.k,
                  "source": replace(source, sequences=source.sequences.absolute()),
                  "output_dir": self.output_dir.absolute(), "threads": round(cfg.cpus_per_actor),
                  "carry": carry, "popularity": self.ranker.popularity}  # fmt: skip
        users_scored = 0
        with _quiet_data_context(ray.data.DataContext.get_current()):  # datasets copy the context when made
            shards = ray.data.from_items([{"shard": s} for s in todo], override_num_blocks=len(todo))
            results = shards.map_batches(
                ShardActor, batch_size=1, compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=cfg.cpus_per_actor,
                num_gpus=cfg.gpus_per_actor or None, fn_constructor_kwargs=kwargs,
            )  # fmt: skip
            rows = _native_stderr_to_file(results.iter_rows())
            for row in rows:
                shard = int(row["shard"])
                if row["error"]:  # the pool stopped first (its actors killed): the job withdraws what it wrote
                    rows.close()
                    raise _USER_ERRORS.get(row["error_type"], ValueError)(row["error"])
                stats = {key: int(row[key]) for key in SHARD_STATS}
                self.hook("written", shard)
                self._record(shard, part_name(shard), stats)
                users_scored += stats["users"]
                advance(stats["users"])
        return users_scored


def actor_device(score: ScoreConfig, ray_cfg: RayConfig) -> str:
    """The ``device`` entry of the job identity when actors score (:func:`serving.rank.device_identity`).

    The actors resolve ``score.device`` themselves: ``auto`` is CUDA only with
    ``score.ray.gpus_per_actor`` (an actor without a GPU sees none). On a local instance they run on
    this machine, which is described; on a cluster only the type is known here.
    """
    import torch

    kind = torch.device(score.device).type if score.device != "auto" else "cuda" if ray_cfg.gpus_per_actor else "cpu"
    if ray_cfg.address is None and (kind != "cuda" or torch.cuda.is_available()):
        return device_identity(torch.device(kind))
    return f"{kind} (the Ray cluster's nodes), torch {torch.__version__}"


@contextmanager
def _quiet_data_context(context) -> Iterator[None]:
    """Ray Data's progress bars and execution logs off while the job runs, the caller's settings restored."""
    quiet = {"enable_progress_bars": False, "enable_auto_log_stats": False, "print_on_execution_start": False}
    before = {key: getattr(context, key) for key in quiet}
    for key, value in quiet.items():
        setattr(context, key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            setattr(context, key, value)


def _native_stderr_to_file(rows: Iterator[dict]) -> Iterator[dict]:
    """Iterate ``rows`` with file descriptor 2 sent to a temporary log file, restored between rows.

    Ray's C++ core worker in this process writes notices straight to descriptor 2, outside
    Python logging (each actor pool logs that its constructor arguments are in the object
    store); they go to ``<tmp>/recsys-alibi-ray-<pid>.log`` instead of the command's output.
    Python code between rows (manifest, progress bar, hooks) writes to the real stderr.
    """
    import os
    import sys
    import tempfile

    path = Path(tempfile.gettempdir()) / f"recsys-alibi-ray-{os.getpid()}.log"
    sys.stderr.flush()
    saved = os.dup(2)
    iterator = iter(rows)
    with open(path, "ab") as sink:
        try:
            while True:
                os.dup2(sink.fileno(), 2)
                try:
                    row = next(iterator)
                except StopIteration:
                    return
                finally:
                    os.dup2(saved, 2)
                yield row
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            getattr(iterator, "close", lambda: None)()  # closed early (an error row): Ray Data stops the pool


def score_with_ray(config: JobConfig, model, items: pl.DataFrame, input_path: str | Path, output_dir: str | Path,
                   **options) -> ScoreJobResult:  # fmt: skip
    """:func:`serving.score.score_with_model` with the shards scored on Ray (``config.score.ray``).

    Same arguments (``options``: ``k``, ``progress``, ``model_ref``, ``hook``), result, output
    files and errors as ``score_with_model``; the manifest identity is the same too, so a
    directory started by either engine is resumed by the other. Starts Ray when it is not
    running (:func:`ray_instance`).

    Raises:
        ConfigError: Ray is not installed.
        DataError, OutputDirError, ValueError: as ``score_with_model``.
    """
    with ray_instance(config.score.ray):
        job = partial(_RayScoreJob, model=model, ray_cfg=config.score.ray)
        return score_with_model(config, model, items, input_path, output_dir, job=job, **options)
