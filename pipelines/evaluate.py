"""``recsys-alibi evaluate``: full-catalog ranking evaluation of a model or a baseline.

Writes ``report.json`` (contract schema), ``report.md`` and PNG plots. A model's evaluation is
also recorded in MLflow as its own run (:func:`log_evaluation_run`: metrics ``test/*``, the report,
tags naming the model, its training run and the data), never in the run that trained the model,
whose recorded results stay as they were. The pipeline's evaluation of the model it just trained
is part of that training run (:mod:`pipelines.pipeline`).

A model is evaluated in its own item numbering: the data's ``item_idx`` are mapped to the model's
by raw ``item_id`` (:func:`in_model_indices`, as ``score`` and the promotion gate do), so a model
of the same items at other indices is evaluated; data items the model does not know are refused.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from recsys_alibi.config import JobConfig
from recsys_alibi.data.prepared import check_prepared
from recsys_alibi.data.sequences import read_items, read_sequences
from recsys_alibi.data.sequences import vocabulary_difference
from recsys_alibi.data.splits import fit_prefix, leave_one_out, resolve_cutoff, temporal_split
from recsys_alibi.data.time_gaps import check_real_timestamps, check_time_protocol, sequences_for
from recsys_alibi.evaluation.baselines import BASELINES
from recsys_alibi.evaluation.evaluator import EvaluationResult, evaluate
from recsys_alibi.evaluation.report import headline_k, write_report
from recsys_alibi.tracking import metric_key

log = logging.getLogger(__name__)

EVALUATES_TAG = "recsys_alibi.evaluates_run_id"  # on an evaluation run: the run that trained the evaluated model


@dataclass(frozen=True)
class EvaluateJobResult:
    """The evaluation result of one scorer and where its report went."""

    name: str
    result: EvaluationResult
    report_dir: Path
    run_id: str | None = None  # the MLflow run recording an ad-hoc evaluation of a model (log_evaluation_run)

    def summary(self) -> str:
        """One line: HR and NDCG at the headline K (10 when evaluated) and MRR, as evaluated."""
        recorded = f"; MLflow run {self.run_id}" if self.run_id else ""
        return (
            f"{self.name}: {self.result.protocol} on {self.result.n_users} users, "
            f"{headline_metrics(self.result.metrics)}; report {self.report_dir}{recorded}"
        )


def protocol_cutoff(config: JobConfig, sequences: pl.DataFrame) -> int | None:
    """The temporal cutoff in use (``evaluate.temporal_cutoff``, 0 included, or the data's default); None for leave-one-out."""
    if config.evaluate.protocol != "temporal":
        return None
    return resolve_cutoff(sequences, config.evaluate.temporal_cutoff)


def headline_metrics(metrics: dict[str, float]) -> str:
    """``"HR@10 0.1234 NDCG@10 0.0567 MRR 0.0456"`` from the metrics that exist.

    K is the report's headline K (:func:`recsys_alibi.evaluation.report.headline_k`: 10 when
    evaluated, else the middle one); a metric that was not evaluated is left out, never shown as nan.
    """
    ks = sorted({int(name.split("@")[1]) for name in metrics if name.startswith("HR@")})
    k = headline_k(ks) if ks else None
    names = ([f"HR@{k}", f"NDCG@{k}"] if k is not None else []) + ["MRR"]
    return " ".join(f"{name} {metrics[name]:.4f}" for name in names if name in metrics)


def test_examples(config: JobConfig, sequences: pl.DataFrame) -> pl.DataFrame:
    """The held-out examples of the configured protocol: ``user_id``, ``history``, ``targets``."""
    if config.evaluate.protocol == "temporal":
        return temporal_split(sequences, protocol_cutoff(config, sequences))  # type: ignore[arg-type]
    return leave_one_out(sequences, "test")


def unevaluated_notes(config: JobConfig, sequences: pl.DataFrame, examples: pl.DataFrame) -> tuple[str, ...]:
    """The report note on the prepared users without a held-out event (not in ``examples``), when there are any:
    a one-event history under leave-one-out, a history ending before the cutoff under temporal."""
    missing = sequences.height - examples.height
    if not missing:
        return ()
    why = ("fewer than 2 events: nothing to hold out" if config.evaluate.protocol == "leave_one_out"
           else "no event at or after the temporal cutoff")  # fmt: skip
    return (f"{missing:,} of the {sequences.height:,} users of the prepared data are not evaluated ({why})",)


def baseline_scorer(name: str, config: JobConfig, sequences: pl.DataFrame, items: pl.DataFrame):
    """A baseline scorer by name (``BASELINES``), fitted on the training information of the protocol.

    It counts every user's fit prefix (:func:`recsys_alibi.data.splits.fit_prefix`: all events
    but the held-out one under leave-one-out, the events before the cutoff under temporal), and
    breaks ties by those events' times and the raw item ids, never by anything held out.

    Raises:
        ValueError: unknown baseline name.
    """
    if name not in BASELINES:
        raise ValueError(f"unknown baseline '{name}'; choose one of {sorted(BASELINES)}")
    seen = fit_prefix(sequences, config.evaluate.protocol, protocol_cutoff(config, sequences))
    return BASELINES[name]().fit(seen, items.height, item_ids=items.sort("item_idx").get_column("item_id"))


def evaluate_scorer(
    config: JobConfig,
    scorer,
    examples: pl.DataFrame,
    n_items: int,
    output_dir: Path,
    baselines: dict[str, EvaluationResult] | None = None,
    cutoff: int | None = None,
    notes: tuple[str, ...] = (),
) -> EvaluateJobResult:
    """Evaluate one scorer on ``examples`` and write its report to ``output_dir``; the report's ``split`` names
    the target events and the temporal ``cutoff`` (seconds, :func:`protocol_cutoff`) when given; ``notes`` go to
    the report's notes first."""
    sweep = config.evaluate.context_lengths
    result = evaluate(
        scorer, examples, n_items, config.evaluate,
        protocol_name=config.evaluate.protocol,
        context_lengths=[*sweep, None] if sweep else (),
    )
    split = {"targets": int(examples.get_column("targets").list.len().sum())}
    result = dataclasses.replace(result, split=split | ({"temporal_cutoff": int(cutoff)} if cutoff is not None else {}),
                                 notes=(*notes, *result.notes))  # fmt: skip
    write_report(result, output_dir, baselines=baselines, title=f"Evaluation: {scorer.name}")
    return EvaluateJobResult(name=scorer.name, result=result, report_dir=output_dir)


def in_model_indices(
    model_items: pl.DataFrame, items: pl.DataFrame, sequences: pl.DataFrame, model_uri: str, prepared_dir: Path
) -> pl.DataFrame:
    """``sequences`` with ``item_idx`` in the model's numbering, mapped by raw ``item_id``.

    Args:
        model_items: the model's vocabulary (``item_idx`` 1..N, ``item_id``).
        items: the prepared directory's vocabulary (``item_idx`` 1..M, ``item_id``).
        sequences: prepared sequences in the data's numbering (``item_idx`` list<Int32>).

    Returns:
        ``sequences`` unchanged when both vocabularies are equal, else with ``item_idx`` remapped
        (:func:`serving.inputs.vocabulary_remap`: ids compared by value, as text when their types differ).

    Raises:
        ValueError: an item of the data is not in the model's vocabulary (its targets could not be ranked).
    """
    from serving.inputs import vocabulary_remap

    remap, unknown = vocabulary_remap(items, model_items)
    if unknown:
        raise ValueError(
            f"model '{model_uri}' was trained on another item vocabulary than {prepared_dir} "
            f"({vocabulary_difference(model_items.get_column('item_id'), items.get_column('item_id'))}): "
            "evaluate on the prepared data the model was trained on"
        )
    return sequences if remap is None else remap_item_idx(sequences, remap)


def remap_item_idx(sequences: pl.DataFrame, remap: np.ndarray) -> pl.DataFrame:
    """``sequences`` with every ``item_idx`` i replaced by ``remap[i]`` (``remap``: (M + 1,) int, 0 -> 0)."""
    return sequences.with_columns(
        pl.col("item_idx").list.eval(
            pl.element().replace_strict(list(range(remap.shape[0])), remap.tolist(), return_dtype=pl.Int32)
        )
    )


def check_training_split(trained: str | None, protocol: str, cutoff: int | None, model_uri: str) -> None:
    """Refuse a model whose training split held events that this evaluation holds out.

    ``trained`` is the model run's ``recsys_alibi.train_split`` tag (``leave_one_out`` or
    ``temporal<C>``; None for runs older than the tag: nothing to check). A leave-one-out model
    trained on every user's events up to the one before the last, so it saw most events at or
    after any temporal cutoff; a ``temporal<C>`` model saw the last event of every user whose
    history ends before ``C`` (a leave-one-out target), and events in ``[cutoff, C)`` when
    ``C`` is later than a temporal evaluation's ``cutoff``. Only a ``temporal<C>`` model with
    ``C <= cutoff`` under temporal, or a leave-one-out model under leave-one-out, is evaluated.

    Raises:
        ValueError: the model trained on held-out events (names the fix).
    """
    if trained is None:
        return
    if protocol == "leave_one_out":
        ok = trained == "leave_one_out"
    else:
        ok = trained.startswith("temporal<") and trained[len("temporal<"):].lstrip("-").isdigit() \
            and int(trained[len("temporal<"):]) <= int(cutoff)  # type: ignore[arg-type]
    if not ok:
        now = "leave_one_out" if protocol == "leave_one_out" else f"temporal<{cutoff}"
        raise ValueError(
            f"model '{model_uri}' was trained on split {trained}, which holds events this {now} evaluation "
            "holds out (its metrics would count trained-on targets); train it with the same evaluate.protocol "
            "and evaluate.temporal_cutoff, or evaluate it with the protocol it was trained on"
        )


def other_data_notes(trained_on: str | None, evaluated_on: str) -> tuple[str, ...]:
    """The report note when the model's run trained on other prepared data than the evaluated directory.

    ``trained_on``: the run's ``recsys_alibi.data_sha256`` tag (None for runs older than it: nothing to say);
    ``evaluated_on``: :func:`recsys_alibi.data.prepared.data_sha256` of the evaluated prepare. A held-out event of
    other data may be one the model trained on (a stricter k-core, an older snapshot of the log: up to every
    target), so the metrics are not a clean test; the data of a later day (appended events) is the usual case."""
    if trained_on is None or trained_on == evaluated_on:
        return ()
    return (f"the model trained on other prepared data (data sha256 {trained_on[:12]}, this directory's "
            f"{evaluated_on[:12]}): a held-out event here may be one it trained on (a stricter k-core or an older "
            "snapshot of the log), so these metrics are not a clean test; evaluate on the directory it trained on",)


def log_report_to_run(run_id: str, job: EvaluateJobResult, prefix: str = "test") -> None:
    """Attach the report files and test metrics to an existing MLflow run."""
    import mlflow

    client = mlflow.MlflowClient()
    for name, value in job.result.metrics.items():
        client.log_metric(run_id, metric_key(f"{prefix}/{name}"), float(value))
    client.log_artifacts(run_id, str(job.report_dir), artifact_path="evaluation")


def log_evaluation_run(
    config: JobConfig, job: EvaluateJobResult, model_uri: str, trained_in: str | None, prepared_dir: Path,
    prepare_id: str | None, cutoff: int | None,
) -> str:
    """Record an ad-hoc evaluation of ``model_uri`` as a new MLflow run of the current experiment.

    The run holds the metrics (``test/*``), the report (``evaluation/``), the ``evaluate.*``
    settings as params and the tags ``recsys_alibi.evaluates_run_id`` (the run that trained the
    model; absent when unknown), ``recsys_alibi.model_uri``, ``recsys_alibi.data_sha256``,
    ``recsys_alibi.prepared`` and ``recsys_alibi.eval_split``. The training run is not changed.

    Returns:
        The new run's id.
    """
    import mlflow

    from pipelines.resume import DATA_TAG
    from recsys_alibi.data.prepared import data_sha256
    from recsys_alibi.tracking import param_values

    split = "leave_one_out" if cutoff is None else f"temporal>={cutoff}"  # the held-out events
    tags = {
        "recsys_alibi.kind": "evaluation", "recsys_alibi.model_uri": model_uri, "recsys_alibi.eval_split": split,
        "recsys_alibi.prepared": str(prepared_dir), DATA_TAG: data_sha256(prepared_dir, prepare_id),
        **({EVALUATES_TAG: trained_in} if trained_in else {}),
    }  # fmt: skip
    with mlflow.start_run(run_name=f"evaluate {model_uri}", tags=tags) as run:
        mlflow.log_params(param_values({"evaluate": config.evaluate.model_dump()}))
    log_report_to_run(run.info.run_id, job)
    return run.info.run_id


def run_evaluate(
    config: JobConfig,
    prepared_dir: str | Path,
    *,
    model_uri: str | None = None,
    baseline: str | None = None,
    output_dir: str | Path | None = None,
) -> EvaluateJobResult:
    """Evaluate ``model_uri`` or ``baseline`` on the test protocol of ``prepared_dir``.

    Every file is read from one prepare of ``prepared_dir`` (its ``prepare_id``); a model's result
    is recorded as a new MLflow run (:func:`log_evaluation_run`).

    Raises:
        ValueError: neither or both of ``model_uri`` and ``baseline`` given, an unknown baseline,
            ``evaluate.protocol=temporal`` on data whose time came from line order
            (:func:`recsys_alibi.data.time_gaps.check_time_protocol`), data items the model does not
            know (:func:`in_model_indices`), or a model trained on events this protocol holds out
            (:func:`check_training_split`).
        ModelUriError: the model URI does not resolve.
        DataError: the prepared directory is missing or malformed, or prepared again while being read.
    """
    if (model_uri is None) == (baseline is None):
        raise ValueError("evaluate needs exactly one of --model-uri URI or --baseline popularity")
    prepared_dir = Path(prepared_dir)
    prepare_id = check_prepared(prepared_dir)  # every read below is of this one prepare
    check_time_protocol(prepared_dir, config.evaluate.protocol, prepare_id)
    sequences = read_sequences(prepared_dir, prepare_id)
    items = read_items(prepared_dir, prepare_id)
    output_dir = Path(output_dir or Path(config.output) / "report")
    if baseline is not None:
        examples = test_examples(config, sequences)
        return evaluate_scorer(config, baseline_scorer(baseline, config, sequences, items), examples, items.height, output_dir,
                               cutoff=protocol_cutoff(config, sequences),
                               notes=unevaluated_notes(config, sequences, examples))  # fmt: skip

    from recsys_alibi.model.scorer import RankerScorer
    from recsys_alibi.tracking import load_ranker, setup_tracking

    setup_tracking(config.tracking, reading=model_uri)
    loaded = load_ranker(model_uri)
    sequences = in_model_indices(loaded.items, items, sequences, model_uri, prepared_dir)
    cutoff = protocol_cutoff(config, sequences)
    if loaded.run_id:
        import mlflow

        from pipelines.resume import DATA_TAG, SPLIT_TAG
        from recsys_alibi.data.prepared import data_sha256

        tags = mlflow.get_run(loaded.run_id).data.tags
        check_training_split(tags.get(SPLIT_TAG), config.evaluate.protocol, cutoff, model_uri)
        notes = other_data_notes(tags.get(DATA_TAG), data_sha256(prepared_dir, prepare_id))
        for note in notes:
            log.warning("warning: %s", note)
    else:
        notes = ()
    scorer = RankerScorer(loaded.model, name=loaded.model.cfg.position)
    if scorer.uses_time_gaps:
        check_real_timestamps(prepared_dir, prepare_id)
    examples = test_examples(config, sequences_for(loaded.model, sequences))  # with the gaps the model reads
    notes = (*notes, *unevaluated_notes(config, sequences, examples))
    job = evaluate_scorer(config, scorer, examples, loaded.items.height, output_dir, cutoff=cutoff, notes=notes)
    run_id = log_evaluation_run(config, job, model_uri, loaded.run_id, prepared_dir, prepare_id, cutoff)
    return dataclasses.replace(job, run_id=run_id)
