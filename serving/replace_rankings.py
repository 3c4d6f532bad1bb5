"""Score into a staging folder and put the new rankings in the place of the old ones as a whole.

The pipeline's scoring step and ``recsys-alibi score --set score.overwrite=true`` over another job's
rankings both go through :func:`score_into_place`: while the new job runs (or after it is killed, or
when it fails), the earlier rankings stay whole, and a reader of the folder never sees a mix of two jobs.
A job that is resumed in place (the same job's shards, :mod:`serving.manifest`) does not come here.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

from recsys_alibi.atomic import replace_dir
from recsys_alibi.config import JobConfig
from recsys_alibi.data.ingest import DataError
from recsys_alibi.staging import staging_dir
from serving.engines import run_score
from serving.manifest import MANIFEST, SKIPPED_DIR
from serving.score import ScoreJobResult


def holds_rankings(output_dir: Path) -> bool:
    """True when ``output_dir`` is a folder with a scoring job's manifest or part files in it."""
    return output_dir.is_dir() and ((output_dir / MANIFEST).exists() or any(output_dir.glob("part-*.parquet")))


def score_into_place(config: JobConfig, model_uri: str, input_path: str | Path, rankings: Path, *,
                     progress: bool) -> ScoreJobResult:  # fmt: skip
    """Score into a staging directory beside ``rankings`` (a link followed to its directory), then put it in the
    place of the earlier rankings as a whole (:func:`recsys_alibi.atomic.replace_dir`).

    A run killed or failing while it scores leaves the earlier rankings as they were (its staging folder is
    removed by the next run, which starts over: no shard is carried across runs, so nothing is doubled or
    missing). A run that ranks no user keeps the earlier rankings and puts its list of users beside them in
    ``RANKINGS.unranked`` (removed by the next run that ranks users).

    Raises:
        As :func:`serving.engines.run_score`; the no-user-ranked DataError names ``RANKINGS.unranked``.
    """
    rankings = Path(os.path.realpath(rankings))
    kept = rankings.with_name(f"{rankings.name}.unranked")
    with staging_dir(rankings) as staging:  # a killed run's staging is removed first, never a running one's
        try:
            scored = run_score(config, model_uri, input_path, staging / rankings.name, progress=progress,
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
