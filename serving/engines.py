"""Score a registered model with the engine ``score.engine`` names: the one module that knows both.

``local`` is :func:`serving.score.score_with_model` (this process, or torchrun shards); ``ray`` is
:func:`serving.ray_job.score_with_ray` (a Ray Data actor pool). The Ray job builds on the local
job (``serving.ray_job`` imports ``serving.score``), so the choice between them lives here and
the imports run one way: ``engines -> ray_job -> score``.

Every caller that scores a model URI (``recsys-alibi score``, the pipeline's scoring step) calls
:func:`run_score`, so each follows ``score.engine``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from recsys_alibi.config import JobConfig
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

    Args and Raises as :func:`serving.score.run_score`, and ConfigError as :func:`engine_scorer`.
    """
    return run_loaded(config, model_uri, input_path, output_dir, k=k, progress=progress, scorer=engine_scorer(config),
                      shown_dir=shown_dir)  # fmt: skip
