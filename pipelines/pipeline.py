"""``recsys-alibi pipeline``: generate (when configured) -> prepare -> train -> evaluate -> score.

Everything lands under ``config.output``: ``events.parquet`` (generated), ``prepared/``,
``checkpoints/``, ``report/`` (the model's report, with the popularity baseline beside it) and
``rankings/`` (top-K part files). The model is logged and registered in MLflow by ``train``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from pipelines.data_steps import run_generate, run_prepare
from pipelines.evaluate import (
    EvaluateJobResult,
    baseline_scorer,
    evaluate_scorer,
    log_report_to_run,
    test_examples,
)
from pipelines.train import TrainJobResult, run_train
from recsys_alibi.config import JobConfig, with_overrides
from recsys_alibi.data.prepare import read_items, read_sequences
from recsys_alibi.evaluation.report import format_metrics_table
from serving.score import ScoreJobResult, run_score

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipelineResult:
    """Every step's result; ``summary()`` is what the command prints at the end."""

    output_dir: Path
    prepare_summary: str
    train: TrainJobResult
    model_eval: EvaluateJobResult
    baseline_eval: EvaluateJobResult
    score: ScoreJobResult
    seconds: float
    ks: tuple[int, ...]

    def summary(self) -> str:
        table = format_metrics_table(
            {self.model_eval.name: self.model_eval.result, "popularity": self.baseline_eval.result}, list(self.ks)
        )
        return "\n".join(
            [
                self.prepare_summary,
                self.train.summary(),
                table,
                f"mlflow_run_id: {self.train.run_id}",
                f"model_uri: {self.train.model.uri}",
                f"report: {self.model_eval.report_dir / 'report.md'}",
                f"rankings: {self.score.output_dir}",
                f"pipeline finished in {self.seconds:.0f} s",
            ]
        )


def run_pipeline(config: JobConfig, *, progress: bool = True) -> PipelineResult:
    """Run every step of the job on ``config`` and return their results."""
    started = time.perf_counter()
    out = Path(config.output)
    input_path = config.data.input
    if config.generate.enabled:
        generated = run_generate(config, out / "events.parquet")
        log.info(generated.summary())
        input_path = str(generated.path)
    prepared_dir = out / "prepared"
    prepared = run_prepare(config, input_path, prepared_dir)

    trained = run_train(config, prepared_dir, progress=progress)
    examples = test_examples(config, read_sequences(prepared_dir))
    n_items = read_items(prepared_dir).height
    popularity = evaluate_scorer(
        config, baseline_scorer("popularity", examples, n_items), examples, n_items, out / "report" / "popularity"
    )
    from recsys_alibi.model.scorer import RankerScorer

    scorer = RankerScorer(trained_model(trained), name=config.model.position)
    model_eval = evaluate_scorer(
        config, scorer, examples, n_items, out / "report", baselines={"popularity": popularity.result}
    )
    log_report_to_run(trained.run_id, model_eval)
    # a new model replaces the rankings of an earlier pipeline run in the same output directory
    rescore = with_overrides(config, score={"overwrite": True})
    scored = run_score(rescore, trained.model.uri, prepared_dir, out / "rankings", progress=progress)
    return PipelineResult(
        output_dir=out,
        prepare_summary=prepared.summary(),
        train=trained,
        model_eval=model_eval,
        baseline_eval=popularity,
        score=scored,
        seconds=time.perf_counter() - started,
        ks=tuple(config.evaluate.ks),
    )


def trained_model(trained: TrainJobResult):
    """The trained ranker, loaded back from its MLflow model URI (what scoring will use too)."""
    from recsys_alibi.tracking import load_ranker

    return load_ranker(trained.model.uri).model
