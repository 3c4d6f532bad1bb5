"""Score a registered model with the engine ``score.engine`` names: the one module that knows both.

``local`` is :func:`serving.score.score_with_model` (this process, or torchrun shards); ``ray`` is
:func:`serving.ray_job.score_with_ray` (a Ray Data actor pool). The Ray job builds on the local
job (``serving.ray_job`` imports ``serving.score``), so the choice between them lives here and
the imports run one way: ``engines -> ray_job -> score``.

Every caller that scores a model URI (``recsys-alibi score``, the pipeline's scoring step) calls
:func:`run_score`, so each follows ``score.engine``.

Replacing rankings as a whole: the pipeline's scoring step, and :func:`run_score` with ``score.overwrite`` over
another job's rankings, score into a staging folder beside them and swap it in at the end
(:func:`score_into_place`): while the new job runs, after it is killed or when it fails, the earlier rankings
stay whole, and a reader never sees a mix of two jobs. A job resumed in place (the same job's shards,
:mod:`serving.manifest`) and torchrun's processes, which share one folder, score in place.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from recsys_alibi.atomic import replace_dir
from recsys_alibi.config import JobConfig
from recsys_alibi.data.ingest import DataError
from recsys_alibi.staging import staging_dir
from serving.distributed import launched_size
from serving.manifest import MANIFEST, SKIPPED_DIR
from serving.score import ScoreJobResult, score_with_model
from serving.score import run_score as run_loaded


def engine_scorer(config: JobConfig) -> Callable[..., ScoreJobResult]:
    """What scores a loaded model under ``score.engine``: :func:`serving.score.score_with_model`
    for ``local``, :func:`serving.ray_job.score_with_ray` for ``ray`` (checked first: Ray
    installed, and ``score.ray.address``, when set, answering; else a folder for a local
    instance's sockets).

    Raises:
        ConfigError: ``ray`` without Ray installed, with an address where no cluster answers, or
            without a folder short enough for a local instance's sockets.
    """
    if config.score.engine != "ray":
        return score_with_model
    from serving.ray_instance import check_ray
    from serving.ray_job import score_with_ray

    check_ray(config.score.ray)
    return score_with_ray


def run_score(config: JobConfig, model_uri: str, input_path: str | Path, output_dir: str | Path, *, k: int | None = None,
              progress: bool = True, shown_dir: str | Path | None = None) -> ScoreJobResult:  # fmt: skip
    """Score every user of ``input_path`` with ``model_uri`` on ``score.engine``'s engine, which is
    checked before the model is loaded (:func:`engine_scorer`; Ray missing or unreachable fails fast).
    With ``score.overwrite`` over another job's rankings (one process): :func:`score_into_place`.

    Args and Raises as :func:`serving.score.run_score`, and ConfigError as :func:`engine_scorer`.
    """
    if config.score.overwrite and holds_rankings(Path(output_dir)) and launched_size() == 1:
        return score_into_place(config, model_uri, input_path, Path(output_dir), k=k, progress=progress)
    return run_loaded(config, model_uri, input_path, output_dir, k=k, progress=progress, scorer=engine_scorer(config),
                      shown_dir=shown_dir)  # fmt: skip


def holds_rankings(output_dir: Path) -> bool:
    """True when ``output_dir`` is a folder with a scoring job's manifest or part files in it."""
    return output_dir.is_dir() and ((output_dir / MANIFEST).exists() or any(output_dir.glob("part-*.parquet")))


def score_into_place(config: JobConfig, model_uri: str, input_path: str | Path, rankings: Path, *,
                     k: int | None = None, progress: bool) -> ScoreJobResult:  # fmt: skip
    """Score into a staging directory beside ``rankings`` (a link followed to its directory), then put it in the
    place of the earlier rankings as a whole (:func:`recsys_alibi.atomic.replace_dir`).

    A run killed or failing while it scores leaves the earlier rankings as they were (its staging folder is
    removed by the next run, which starts over: no shard is carried across runs, so nothing is doubled or
    missing). A run that ranks no user keeps the earlier rankings and puts its list of users beside them in
    ``RANKINGS.unranked`` (removed by the next run that ranks users).

    Raises:
        As :func:`run_score`; the no-user-ranked DataError names ``RANKINGS.unranked``.
    """
    rankings = Path(os.path.realpath(rankings))
    kept = rankings.with_name(f"{rankings.name}.unranked")
    with staging_dir(rankings) as staging:  # a killed run's staging is removed first, never a running one's
        try:
            scored = run_score(config, model_uri, input_path, staging / rankings.name, k=k, progress=progress,
                               shown_dir=rankings)  # fmt: skip
        except DataError as error:
            unranked = staging / rankings.name / SKIPPED_DIR
            if not unranked.is_dir():
                raise
            replace_dir(unranked, kept)
            raise DataError(f"{str(error).replace(str(unranked), str(kept))}; the earlier rankings in {rankings} "
                            "were left as they were") from None  # fmt: skip
        replace_dir(staging / rankings.name, rankings)
    shutil.rmtree(kept, ignore_errors=True)  # an earlier failed run's list, outdated by these rankings
    return replace(scored, output_dir=rankings)
