"""``recsys-alibi pipeline``: generate (when configured) -> prepare -> train -> evaluate -> gate -> score.

Everything lands under ``config.output``: ``events.parquet`` (generated), ``prepared/``,
``checkpoints/``, ``report/`` (the new model's test report, with the popularity baseline beside
it) and ``rankings/`` (top-K part files). The model is logged and registered in MLflow by
``train``; the training run gets ``lineage.*`` tags; the promotion gate (:mod:`pipelines.promotion`)
compares the new version with the ``tracking.champion_alias`` version on validation examples and
moves the alias or tags the new version ``rejected``; rankings come from ``models:/NAME/VERSION`` of the
version that held the alias when the gate released its lock (read under the lock, never the alias read
again: another pipeline may move it meanwhile). The champion the prior choice and a warm start use is
resolved once, before any data work (:func:`pipelines.preflight.check_before_data`).

The new version is tagged ``promotion.decision=pending`` as soon as it is registered; a run killed (or
failed) before its gate leaves it so, and the next run on the same data with the same config gates that
version instead of training and registering another (:func:`pipelines.promotion.pending_version`). Made to
run as a scheduled job (docs/scheduling.md).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pipelines.collisions import check_pipeline_paths
from pipelines.data_steps import reading_generated_table, run_generate, run_prepare
from pipelines.evaluate import (
    EvaluateJobResult,
    baseline_scorer,
    evaluate_scorer,
    log_report_to_run,
    protocol_cutoff,
    test_examples,
)
from pipelines.promotion import (
    GateResult,
    check_promotion_metric,
    lineage_tags,
    log_gate_to_run,
    pending_tags,
    pending_version,
    run_gate,
    tag_incomplete,
    tag_lineage,
)
from pipelines.preflight import check_before_data
from pipelines.prior_choice import PRIOR_FILE, append_boundary, check_prior_data, chosen_prior, record_newest_period
from pipelines.train import TrainJobResult, run_train
from recsys_alibi.config import ConfigError, JobConfig, with_overrides
from recsys_alibi.data.append import check_appendable
from recsys_alibi.data.formats import resolve_paths
from recsys_alibi.data.prepared import check_prepared, data_sha256, prepare_lock
from recsys_alibi.data.sequences import read_items, read_sequences
from recsys_alibi.data.time_gaps import has_real_timestamps, sequences_for
from recsys_alibi.evaluation.report import format_metrics_table
from serving.distributed import launched_size
from serving.engines import engine_scorer, score_into_place
from serving.manifest import SKIPPED_DIR
from serving.score import ScoreJobResult

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
    gate: GateResult
    lineage: dict[str, str]
    same_lineage_runs: tuple[str, ...]  # earlier runs with the same data fingerprint and config hash
    prior_line: str = ""  # score.popularity_prior.choose: the weight the rankings used, and why (prior_choice)

    def lineage_line(self) -> str:
        """The data fingerprint and config hash, and whether an earlier run had the same."""
        tags = self.lineage
        if self.same_lineage_runs:
            same = f"same data and config as earlier run(s) {', '.join(self.same_lineage_runs[:3])}"
        elif self.train.ungated:  # the gated run is itself the earlier run of this data and config
            same = f"run {self.train.run_id} (an earlier pipeline's, gated now) trained on this data and config"
        else:
            same = "no earlier run with this data and config"
        return (
            f"lineage: data sha256 {tags['lineage.data.sha256'][:12]}, config sha256 "
            f"{tags['lineage.config_sha256'][:12]}, version {tags['lineage.project_version']}, "
            f"commit {tags['lineage.git_commit'][:12]}, seed {tags['lineage.seed']}; {same}"
        )

    def decision_line(self) -> str:
        """The one-line outcome of a scheduled run."""
        tags = self.lineage
        return (
            f"pipeline: data {tags['lineage.data.events']} events, {tags['lineage.data.users']} users, "
            f"{tags['lineage.data.items']} items; run {self.train.run_id}; {self.gate.line()}"
        )

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
                f"rankings: {self.score.output_dir} (from {self.gate.champion_uri}): ranked {self.score.users_ranked} "
                f"of {self.score.users} users"
                + (f"; not ranked: {self.score.skipped_users} (listed in {self.score.output_dir / SKIPPED_DIR})"
                   if self.score.skipped_users else "")
                + (f"; carried over from the earlier rankings (history unchanged): {self.score.carried_users}"
                   if self.score.carried_users else ""),
                *(self.score.new_item_lines() if self.score.new_items or self.score.slots_asked else []),
                *([self.prior_line] if self.prior_line else []),
                self.lineage_line(),
                f"pipeline finished in {self.seconds:.0f} s",
                self.decision_line(),
            ]
        )


def run_pipeline(config: JobConfig, *, progress: bool = True) -> PipelineResult:
    """Run every step of the job on ``config`` and return their results.

    Raises:
        ValueError: ``tracking.registered_model`` is empty (the gate needs a registry entry), or
            ``tracking.promotion_metric`` is not among the evaluated metrics (checked before training).
        ConfigError, ModelUriError: a training setting refused before any data is generated or
            prepared (:func:`pipelines.preflight.check_before_data`).
    """
    if not config.tracking.registered_model:
        raise ValueError("the pipeline registers and promotes models: set tracking.registered_model to a name")
    check_promotion_metric(config)
    check_pipeline_launch(config)
    engine_scorer(config)  # score.engine=ray (used by the scoring step): Ray and its cluster checked before training
    champion = check_before_data(config)  # every training check that needs no data: before a day is appended
    check_pipeline_paths(config)  # outputs apart from every input and other output, before any work
    with prepare_lock(Path(config.output), command="pipeline"):  # a second run on this output: refused, not mixed
        return _run_steps(config, progress, champion)


def _run_steps(config: JobConfig, progress: bool, champion=None) -> PipelineResult:
    """generate -> prepare -> train -> evaluate -> gate -> score, under the output's lock (:func:`run_pipeline`).

    ``champion``: the champion pinned by the preflight (:class:`pipelines.promotion.Champion`), used by the prior
    choice and a warm start from ``champion``; None: each reads the alias itself."""
    started = time.perf_counter()
    out = Path(config.output)
    input_path = config.data.input
    if config.data.append:  # before anything is generated
        check_appendable(out / "prepared", "run the first day's pipeline without data.append (docs/scheduling.md)")
    if input_path is not None and not config.generate.enabled:  # missing: named as the pipeline takes it, before work
        resolve_paths(input_path, "input", "data.input (--set data.input=PATH; a relative path is read from the "
                                           "working directory, not from the config's folder)")  # fmt: skip
    if config.generate.enabled:
        if config.data.input is not None:  # two sources of events: the one ignored would be a silent surprise
            raise ValueError(f"generate.enabled=true generates the pipeline's events, so data.input={config.data.input} "
                             "would be ignored: set generate.enabled=false to read data.input, or drop data.input")
        if config.generate.days is not None:
            raise ValueError("generate.days writes daily files with `recsys-alibi generate --days N`; a pipeline reads "
                             "one day: set data.input to a day file and generate.enabled=false (docs/scheduling.md)")
        generated = run_generate(config, out / "events.parquet")
        log.info(generated.summary())
        input_path = str(generated.path)
        config = reading_generated_table(config, generated)
        # the pipeline's own generated log replaces the one it generated before (its prepared data is its own)
        config = with_overrides(config, data={"overwrite": True})
    prepared_dir = out / "prepared"
    check_prior_data(config, prepared_dir, out / PRIOR_FILE)  # before the day is appended
    boundary = append_boundary(config, prepared_dir)  # score.popularity_prior.choose: where this append begins
    prepared = run_prepare(config, input_path, prepared_dir)
    check_prior_data(config, prepared_dir, out / PRIOR_FILE)  # a first prepare of line-order data: before training
    record_newest_period(config, prepared_dir, boundary, out / PRIOR_FILE, champion)  # the champion on the appended events

    from recsys_alibi.tracking import setup_tracking

    setup_tracking(config.tracking)
    data_sha = data_sha256(prepared_dir)
    pending = pending_version(config, data_sha)  # an earlier run's version of this data and config, never gated
    if pending is not None:
        log.warning("pipeline: version %s of '%s' (run %s) was registered by an earlier run on this data with this "
                    "config and never gated (killed or failed before its gate): gating it now instead of training "
                    "another", pending.version, config.tracking.registered_model, pending.run_id)  # fmt: skip
        trained = ungated_train_result(pending, check_prepared(prepared_dir))
    else:
        if prepared.appended is False:  # a re-run of a day already appended (a retry after a failure, a doubled cron)
            log.warning("pipeline: nothing new was appended (every input file is already prepared): training again on "
                        "data the directory already held; the gate keeps the champion unless the new version beats it")  # fmt: skip
        trained = run_train(config, prepared_dir, progress=progress, champion=champion,
                            version_tags=pending_tags(config, data_sha))  # fmt: skip
    try:
        gated = _evaluate_and_gate(config, trained)
    except BaseException as err:  # the version stays pending, with the reason: the next run on this data gates it
        if trained.model is not None and trained.model.version is not None:
            tag_incomplete(config, str(trained.model.version), err)
        raise
    prior, prior_line = chosen_prior(config, prepared_dir, out / PRIOR_FILE)
    rescore = with_overrides(config, score={"popularity_prior": prior})
    # the version the gate settled on (models:/NAME/V), never the alias read again: another pipeline may move it
    scored = score_into_place(rescore, gated.gate.champion_uri, prepared_dir, out / "rankings", progress=progress)
    return PipelineResult(
        output_dir=out,
        prepare_summary=prepared.summary(),
        train=trained,
        model_eval=gated.model_eval,
        baseline_eval=gated.popularity,
        score=scored,
        seconds=time.perf_counter() - started,
        ks=tuple(config.evaluate.ks),
        gate=gated.gate,
        lineage=gated.lineage,
        same_lineage_runs=tuple(gated.same_lineage),
        prior_line=prior_line,
    )


@dataclass(frozen=True)
class _Gated:
    """What :func:`_evaluate_and_gate` produced."""

    lineage: dict[str, str]
    same_lineage: list[str]
    popularity: EvaluateJobResult
    model_eval: EvaluateJobResult
    gate: GateResult


def _evaluate_and_gate(config: JobConfig, trained: TrainJobResult) -> _Gated:
    """Lineage tags, the test reports (the model and the popularity baseline) and the gate, on the prepare the
    model was trained on: everything between a version's registration and its decision."""
    out = Path(config.output)
    prepared_dir = out / "prepared"
    prepare_id = trained.prepare_id  # evaluation and the gate read the prepare the model was trained on
    lineage = lineage_tags(config, prepared_dir, prepare_id)
    same_lineage = tag_lineage(trained.run_id, lineage)
    sequences = read_sequences(prepared_dir, prepare_id)
    items = read_items(prepared_dir, prepare_id)
    model = trained_model(trained)
    examples = test_examples(config, sequences_for(model, sequences))  # with time gaps if the model reads them
    n_items = items.height
    cutoff = protocol_cutoff(config, sequences)
    popularity = evaluate_scorer(
        config, baseline_scorer("popularity", config, sequences, items), examples, n_items, out / "report" / "popularity",
        cutoff=cutoff,
    )
    from recsys_alibi.model.scorer import RankerScorer

    scorer = RankerScorer(model, name=config.model.position)
    model_eval = evaluate_scorer(
        config, scorer, examples, n_items, out / "report", baselines={"popularity": popularity.result}, cutoff=cutoff
    )
    log_report_to_run(trained.run_id, model_eval)
    gate = run_gate(config, model, str(trained.model.version), items, sequences,
                    has_real_timestamps(prepared_dir, prepare_id))  # fmt: skip
    log_gate_to_run(trained.run_id, gate)
    return _Gated(lineage, same_lineage, popularity, model_eval, gate)


def ungated_train_result(version, prepare_id: str | None) -> TrainJobResult:
    """A :class:`TrainJobResult` for a registered version an earlier run trained and never gated
    (:func:`pipelines.promotion.pending_version`), read from its MLflow run: nothing is trained again."""
    import mlflow

    from recsys_alibi.tracking import LoggedModel

    metrics = mlflow.MlflowClient().get_run(version.run_id).data.metrics
    return TrainJobResult(
        run_id=version.run_id,
        model=LoggedModel(uri=f"runs:/{version.run_id}/model", run_id=version.run_id, version=str(version.version)),
        best_val_ndcg_at_10=float(metrics.get("best_val_ndcg_at_10", float("nan"))),
        epochs=0,
        train_seconds=float(metrics.get("train_seconds", 0.0)),
        checkpoint="",
        prepare_id=prepare_id,
        ungated=True,
    )


def check_pipeline_launch(config: JobConfig, env: dict[str, str] | None = None) -> None:
    """Refuse a pipeline started on several processes at once (torchrun, ``srun`` with tasks > 1).

    With ``train.devices > 1`` the pipeline runs once and Lightning starts the other training
    processes when training begins; they only train (``pipelines.cli``). A launcher that starts
    every process at once would run generate/prepare on every rank at the same time.

    Raises:
        ConfigError: naming the two-step recipe of docs/scaling.md.
    """
    env = os.environ if env is None else env
    torchrun = "RANK" in env and launched_size(env) > 1
    slurm = int(env.get("SLURM_NTASKS", "1")) > 1 and "LOCAL_RANK" not in env
    if torchrun or slurm:
        raise ConfigError(
            "pipeline runs its steps once: under torchrun/srun run `recsys-alibi prepare` first, then "
            "`recsys-alibi train` on every process (docs/scaling.md), or use --set train.devices=N on one machine"
        )


def trained_model(trained: TrainJobResult):
    """The trained ranker, loaded back from its MLflow model URI (what scoring will use too)."""
    from recsys_alibi.tracking import load_ranker

    return load_ranker(trained.model.uri).model
